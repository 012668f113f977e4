-- Batch queries of the SQLite engine.
--
-- SQLite runs one writer at a time, so the transaction that finalizes a batch's
-- last job folds its progress and completes it with no other to race it; the
-- progress rows and the sweep exist for symmetry with PostgreSQL and for
-- progress a client of another engine left.

-- name: batch_insert
INSERT INTO hopper_batch (id, name, is_workflow, total, pending, failed, completed_at,
                          created_at, metadata, on_success, on_failure, on_complete)
VALUES (%(id)s, %(name)s, %(is_workflow)s, %(total)s, %(total)s, 0, NULL, %(now)s,
        %(metadata)s, %(on_success)s, %(on_failure)s, %(on_complete)s);

-- name: batch_settle
-- Fold the progress of the open batches in %(ids)s (a JSON array of hex IDs).
-- SET expressions read the old row.
UPDATE hopper_batch
SET pending = max(pending - coalesce((SELECT sum(p.done) FROM hopper_batch_progress AS p
                                      WHERE p.batch_id = hopper_batch.id), 0), 0),
    failed = failed + coalesce((SELECT sum(p.failed) FROM hopper_batch_progress AS p
                                WHERE p.batch_id = hopper_batch.id), 0)
WHERE id IN (SELECT value FROM json_each(%(ids)s))
  AND completed_at IS NULL
RETURNING id;

-- name: batch_settle.complete
-- Complete the folded batches with nothing pending; the one writer makes this the
-- only transaction that sees them open, so their callbacks are inserted once.
UPDATE hopper_batch
SET completed_at = %(now)s
WHERE id IN (SELECT value FROM json_each(%(ids)s))
  AND completed_at IS NULL
  AND pending <= 0
RETURNING id, failed, on_success, on_failure, on_complete;

-- name: batch_settle.folded
DELETE FROM hopper_batch_progress
WHERE batch_id IN (SELECT value FROM json_each(%(ids)s));

-- name: batch_settle.sweep
-- The leader's sweep: open batches after %(after)s with progress or nothing pending.
SELECT b.id
FROM hopper_batch AS b
WHERE b.completed_at IS NULL
  AND b.id > %(after)s
  AND (b.pending = 0 OR EXISTS (SELECT 1 FROM hopper_batch_progress AS p
                                WHERE p.batch_id = b.id))
ORDER BY b.id
LIMIT %(limit)s;

-- name: batch_settle.results
-- Dependency results nobody will read again: their workflow completed or is gone.
DELETE FROM hopper_dependency_result
WHERE job_id IN (
    SELECT x.job_id FROM hopper_dependency_result AS x
    WHERE NOT EXISTS (SELECT 1 FROM hopper_batch AS b
                      WHERE b.id = x.workflow_id AND b.completed_at IS NULL)
    LIMIT %(limit)s);

-- name: batch_count_duplicates
-- Inputs of batches that an existing job duplicated (%(pairs)s: a JSON array of
-- [batch, job] hex IDs): a live job of no batch that is not running joins the
-- input's batch, so its end is counted as any batch job's. Returns the jobs
-- that joined; batch_count_duplicates.record counts the others.
UPDATE hopper_job
SET batch_id = (SELECT json_extract(d.value, '$[0]') FROM json_each(%(pairs)s) AS d
                WHERE json_extract(d.value, '$[1]') = hopper_job.id)
WHERE id IN (SELECT json_extract(value, '$[1]') FROM json_each(%(pairs)s))
  AND batch_id IS NULL AND state <> 'running'
RETURNING id;

-- name: batch_count_duplicates.record
-- Count the other inputs toward their batches now: done, and failed when the
-- job is in history as canceled or discarded. Returns the batches counted.
INSERT INTO hopper_batch_progress (batch_id, done, failed)
SELECT json_extract(d.value, '$[0]'), count(*),
       sum(CASE WHEN h.state IN ('canceled', 'discarded') THEN 1 ELSE 0 END)
FROM json_each(%(pairs)s) AS d
LEFT JOIN hopper_job_history AS h ON h.id = json_extract(d.value, '$[1]')
WHERE true
GROUP BY json_extract(d.value, '$[0]')
RETURNING batch_id, done;

-- name: batch_get
SELECT b.id, b.name,
       b.pending - coalesce((SELECT sum(p.done) FROM hopper_batch_progress AS p
                             WHERE p.batch_id = b.id), 0),
       b.failed + coalesce((SELECT sum(p.failed) FROM hopper_batch_progress AS p
                            WHERE p.batch_id = b.id), 0),
       b.total, b.completed_at, b.created_at, b.metadata, b.is_workflow
FROM hopper_batch AS b
WHERE b.id = %(id)s;
