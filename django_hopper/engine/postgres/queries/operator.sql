-- Operator statements: cancel, retry and delete, over one job or many.
--
-- Each takes an array of job IDs (the one-job methods pass one) and decides
-- every job in one statement: a waiting job is canceled into history and a
-- running one gets a cancel request (an earlier request's time is kept); a
-- running job is neither retried nor deleted; a finished job comes back to
-- live, available now, one more attempt allowed if it had run out, unless a
-- live job holds its unique key. Rows are locked in ID order, so two
-- bulk statements over overlapping sets cannot deadlock.

-- name: job_cancel_many
-- Returns the jobs canceled (from history) and those asked to stop (live).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
target AS (
    SELECT j.id, j.state FROM hopper_job j WHERE j.id = ANY(%(ids)s::uuid[])
    ORDER BY j.id FOR UPDATE
),
gone AS (
    DELETE FROM hopper_job j
    USING target t
    WHERE j.id = t.id AND t.state <> 'running'
    RETURNING {job_columns:j}
),
archived AS (
    INSERT INTO hopper_job_history ({job_columns_history})
    SELECT g.id, g.kind, g.queue, 'canceled', g.priority, g.attempt, g.max_attempts,
           g.scheduled_at, g.attempted_at, g.attempted_by, g.fence, g.args,
           {history_metadata_g},
           g.errors || jsonb_build_array(jsonb_build_object(
               'at', c.now, 'attempt', g.attempt, 'error', 'canceled', 'rescue', 'canceled')),
           g.unique_key, g.ordering_key, g.partition_key, g.tags, g.batch_id, g.expires_at,
           g.cancel_requested_at, g.awaited, g.created_at, NULL, g.progress, NULL, NULL, NULL,
           g.step, g.subject, g.erased_at,
           c.now, NULL
    FROM gone g CROSS JOIN clock c
    RETURNING {job_columns_history:hopper_job_history}
),
requested AS (
    UPDATE hopper_job j
    SET cancel_requested_at = coalesce(j.cancel_requested_at, c.now)
    FROM target t CROSS JOIN clock c
    WHERE j.id = t.id AND t.state = 'running'
    RETURNING {job_columns:j}
)
SELECT * FROM archived
UNION ALL
SELECT * FROM requested

-- name: job_cancel_many.where
-- Which of the IDs are live (with their state) or only in history (all three methods read it).
SELECT j.id, j.state FROM hopper_job j WHERE j.id = ANY(%(ids)s::uuid[])
UNION ALL
SELECT DISTINCT h.id, 'finished' FROM hopper_job_history h
WHERE h.id = ANY(%(ids)s::uuid[])
  AND NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.id = h.id)

-- name: job_retry_many
-- Waiting jobs run now; running ones are left alone (the caller reports them).
UPDATE hopper_job j
SET scheduled_at = coalesce(%(now)s::timestamptz, now()),
    expires_at = NULL,
    snooze_reason = NULL,
    state = CASE WHEN j.state = 'pending' THEN 'pending' ELSE 'available' END,
    progress = CASE WHEN %(from_start)s THEN NULL ELSE j.progress END
WHERE j.id = ANY(%(ids)s::uuid[]) AND j.state <> 'running'
RETURNING {job_columns:j}

-- name: job_retry_many.lock
SELECT id, state FROM hopper_job WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE

-- name: job_retry_many.history
-- Finished jobs back to live, one row per job found in history: the job as it
-- is now, or NULLs when a live job holds its unique key (nothing is deleted).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
locked AS (
    SELECT * FROM hopper_job_history
    WHERE id = ANY(%(ids)s::uuid[])
    ORDER BY id
    FOR UPDATE
),
h AS (
    SELECT DISTINCT ON (id) * FROM locked ORDER BY id, finalized_at DESC
),
revived AS (
    INSERT INTO hopper_job AS j ({job_columns_live})
        SELECT h.id, h.kind, h.queue, 'available', h.priority, h.attempt,
               CASE WHEN h.attempt >= h.max_attempts THEN h.attempt + 1 ELSE h.max_attempts END,
               c.now, h.attempted_at, h.attempted_by, h.fence, h.args, h.metadata, h.errors,
               h.unique_key, h.ordering_key, h.partition_key, h.tags, h.batch_id, NULL, NULL,
               h.awaited, h.created_at, NULL,
               CASE WHEN %(from_start)s THEN NULL ELSE h.progress END, NULL, NULL, NULL, h.step,
               h.subject, h.erased_at
        FROM h CROSS JOIN clock c
        ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
        RETURNING {job_columns:j}
),
removed AS (
    DELETE FROM hopper_job_history d USING revived r WHERE d.id = r.id
)
SELECT h.id AS found, r.*
FROM h
LEFT JOIN revived r ON r.id = h.id

-- name: job_delete_many
-- Remove jobs that are not running, live or from history, with their logs and
-- their step ledgers.
WITH live AS (
    DELETE FROM hopper_job j
    WHERE j.id = ANY(%(ids)s::uuid[]) AND j.state <> 'running'
    RETURNING {job_columns:j}
),
hist AS (
    DELETE FROM hopper_job_history h
    WHERE h.id = ANY(%(ids)s::uuid[])
    RETURNING {job_columns_history:h}
),
logs AS (
    DELETE FROM hopper_job_log l
    WHERE l.job_id IN (SELECT id FROM live UNION ALL SELECT id FROM hist)
),
steps AS (
    DELETE FROM hopper_job_step s
    WHERE s.job_id IN (SELECT id FROM live UNION ALL SELECT id FROM hist)
)
SELECT * FROM live
UNION ALL
SELECT * FROM hist
