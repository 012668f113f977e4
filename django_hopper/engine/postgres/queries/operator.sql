-- Operator statements over many jobs at once (the admin's bulk actions).
--
-- Each takes an array of job IDs and decides every job in one statement, by
-- the same rules as the one-job statements in jobs.sql: a waiting job is
-- canceled into history and a running one gets a cancel request; a running
-- job is neither retried nor deleted; a finished job comes back to live
-- unless a live job holds its unique key. Rows are locked in ID order, so two
-- bulk statements over overlapping sets cannot deadlock.

-- name: job_cancel_many
-- Returns the jobs canceled (from history) and those asked to stop (live).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
target AS (
    SELECT j.id, j.state FROM hopper_job j WHERE j.id = ANY(%(ids)s::uuid[])
    ORDER BY j.id FOR UPDATE
),
{job_cancel_targets}

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
    {job_revive}
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
