-- Batch queries of the PostgreSQL engine.
--
-- Statements that finalize jobs never touch hopper_batch (that would serialize
-- them on the batch row): they append hopper_batch_progress rows, which
-- batch_settle folds in under the batch row's lock. Only the transaction whose
-- fold brings `pending` to zero sets completed_at, so only it inserts callbacks.

-- fragment: gone_failed_progress
-- A CTE for a statement that ends jobs without running them (`gone`): each one
-- in a batch counts as done and failed in its batch's progress rows.
progress AS (
    INSERT INTO hopper_batch_progress (batch_id, done, failed)
    SELECT g.batch_id, count(*), count(*)
    FROM gone g WHERE g.batch_id IS NOT NULL
    GROUP BY g.batch_id
)

-- fragment: batch_fold
-- The end of a settle: fold the progress rows of the locked batches (`target`)
-- into them, completing those with nothing pending; return the batches folded.
folded AS (
    DELETE FROM hopper_batch_progress p USING target t
    WHERE p.batch_id = t.id
    RETURNING p.batch_id, p.done, p.failed
),
sums AS (
    SELECT f.batch_id, sum(f.done) AS done, sum(f.failed) AS failed
    FROM folded f GROUP BY f.batch_id
),
updated AS (
    UPDATE hopper_batch b
    SET pending = greatest(b.pending - coalesce(s.done, 0), 0),
        failed = b.failed + coalesce(s.failed, 0),
        completed_at = CASE WHEN b.pending - coalesce(s.done, 0) <= 0 THEN c.now END
    FROM target t LEFT JOIN sums s ON s.batch_id = t.id CROSS JOIN clock c
    WHERE b.id = t.id
    RETURNING b.id, b.completed_at IS NOT NULL AS completed, b.failed, b.on_success,
              b.on_failure, b.on_complete
)
SELECT * FROM updated ORDER BY id

-- name: batch_insert
INSERT INTO hopper_batch (id, name, is_workflow, total, pending, failed, completed_at,
                          created_at, metadata, on_success, on_failure, on_complete)
VALUES (%(id)s::uuid, %(name)s, %(is_workflow)s, %(total)s, %(total)s, 0, NULL,
        coalesce(%(now)s::timestamptz, now()), %(metadata)s::jsonb, %(on_success)s::jsonb,
        %(on_failure)s::jsonb, %(on_complete)s::jsonb)
RETURNING created_at

-- name: batch_settle
-- Settle the named batches: lock each open one (waiting briefly for a settle
-- that holds it: settles are short; batches.py bounds the wait with
-- batch_settle.lock_timeout and, past it, runs this statement again with SKIP
-- LOCKED, leaving what it cannot lock to the sweep), fold its progress rows
-- and complete it when nothing is pending. Returns the batches folded.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
target AS (
    SELECT b.id FROM hopper_batch b
    WHERE b.id = ANY (%(ids)s::uuid[]) AND b.completed_at IS NULL
    ORDER BY b.id
    FOR UPDATE
),
{batch_fold}

-- name: batch_settle.lock_timeout
-- Bound the row-lock waits of what follows in this transaction (or savepoint);
-- return the value it replaces, which batch_settle.lock_timeout_restore puts back.
WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value)
SELECT p.value, set_config('lock_timeout', %(value)s, true) FROM previous p

-- name: batch_settle.lock_timeout_restore
SELECT set_config('lock_timeout', %(value)s, true)

-- name: batch_settle.sweep
-- The leader's sweep: open batches after %(after)s with progress (or nothing
-- pending), skipping rows another settle holds.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
target AS (
    SELECT b.id FROM hopper_batch b
    WHERE b.completed_at IS NULL
      AND (%(after)s::uuid IS NULL OR b.id > %(after)s::uuid)
      AND (b.pending = 0 OR EXISTS (SELECT 1 FROM hopper_batch_progress p
                                    WHERE p.batch_id = b.id))
    ORDER BY b.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
{batch_fold}

-- name: batch_settle.results
-- Dependency results nobody will read again: their workflow completed or is gone.
DELETE FROM hopper_dependency_result r
WHERE r.job_id IN (
    SELECT x.job_id FROM hopper_dependency_result x
    WHERE NOT EXISTS (SELECT 1 FROM hopper_batch b
                      WHERE b.id = x.workflow_id AND b.completed_at IS NULL)
    LIMIT %(limit)s
)

-- name: batch_get
-- The batch as last folded, with the progress not folded yet counted in.
SELECT b.id, b.name, b.pending - coalesce(p.done, 0), b.failed + coalesce(p.failed, 0),
       b.total, b.completed_at, b.created_at, b.metadata, b.is_workflow
FROM hopper_batch b
LEFT JOIN LATERAL (SELECT sum(x.done) AS done, sum(x.failed) AS failed
                   FROM hopper_batch_progress x WHERE x.batch_id = b.id) p ON true
WHERE b.id = %(id)s::uuid

-- name: batch_count_duplicates
-- Inputs of batches that an existing job duplicated (pairs of batch and job):
-- a live job of no batch that is not running joins the input's batch, so its
-- end is counted as any batch job's. Returns the jobs that joined; the others
-- are counted by batch_count_duplicates.record, a later statement, so that it
-- sees a job a concurrent finalize moved to history meanwhile.
UPDATE hopper_job j
SET batch_id = d.batch_id
FROM unnest(%(batch_id)s::uuid[], %(job_id)s::uuid[]) AS d(batch_id, job_id)
WHERE j.id = d.job_id AND j.batch_id IS NULL AND j.state <> 'running'
RETURNING j.id

-- name: batch_count_duplicates.record
-- Count the other inputs toward their batches now: done, and failed when the
-- job is in history as canceled or discarded. Returns the batches counted.
INSERT INTO hopper_batch_progress (batch_id, done, failed)
SELECT d.batch_id, count(*),
       count(*) FILTER (WHERE h.state IN ('canceled', 'discarded'))
FROM unnest(%(batch_id)s::uuid[], %(job_id)s::uuid[]) AS d(batch_id, job_id)
LEFT JOIN hopper_job_history h ON h.id = d.job_id
GROUP BY d.batch_id
RETURNING batch_id, done
