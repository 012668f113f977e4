-- Operator statements: cancel, retry and delete, over one job or many.
--
-- %(ids)s is a JSON array of job IDs (hex), read with json_each; the one-job
-- methods pass one. A waiting job is canceled into history and a running one
-- gets a cancel request (an earlier request's time is kept); a running job is
-- neither retried nor deleted; a finished job comes back to live, available
-- now, one more attempt allowed if it had run out, its progress kept unless
-- %(from_start)s, unless a live job holds its unique key.

-- name: job_cancel_many
-- Waiting jobs to history as canceled.
INSERT INTO hopper_job_history ({job_columns_history})
SELECT id, kind, queue, 'canceled', priority, attempt, max_attempts, scheduled_at,
       attempted_at, attempted_by, fence, args, {history_metadata},
       hopper_json_append(errors, json_object('at', %(at)s, 'attempt', attempt,
                                              'error', 'canceled', 'rescue', 'canceled')),
       unique_key, ordering_key, partition_key, tags, batch_id, expires_at,
       cancel_requested_at, awaited, created_at, NULL, progress, NULL, NULL, NULL,
       step, subject, erased_at, %(now)s, NULL
FROM hopper_job
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND state IN ('pending', 'available', 'scheduled', 'retryable');

-- name: job_cancel_many.delete
DELETE FROM hopper_job
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND state IN ('pending', 'available', 'scheduled', 'retryable')
RETURNING id, awaited;

-- name: job_cancel_many.request
UPDATE hopper_job
SET cancel_requested_at = coalesce(cancel_requested_at, %(now)s)
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND state = 'running'
RETURNING id;

-- name: job_cancel_many.rows
-- The jobs, live or from history, as job_get reads one (all three methods read it).
SELECT {job_columns}
FROM hopper_job
WHERE id IN (SELECT value FROM json_each(%(ids)s))
UNION ALL
SELECT {job_columns_history}
FROM hopper_job_history
WHERE id IN (SELECT value FROM json_each(%(ids)s))
ORDER BY finalized_at;

-- name: job_retry_many
-- Finished jobs back to live, unless a live job (or an earlier job of this
-- call) holds their unique key.
INSERT INTO hopper_job ({job_columns_live})
SELECT h.id, h.kind, h.queue, 'available', h.priority, h.attempt,
       CASE WHEN h.attempt >= h.max_attempts THEN h.attempt + 1 ELSE h.max_attempts END,
       %(now)s, h.attempted_at, h.attempted_by, h.fence, h.args, h.metadata, h.errors,
       h.unique_key, h.ordering_key, h.partition_key, h.tags, h.batch_id, NULL, NULL,
       h.awaited, h.created_at, NULL,
       CASE WHEN %(from_start)s THEN NULL ELSE h.progress END, NULL, NULL, NULL, h.step,
       h.subject, h.erased_at
FROM hopper_job_history AS h
WHERE h.id IN (SELECT value FROM json_each(%(ids)s))
  AND NOT EXISTS (
      SELECT 1 FROM hopper_job AS l
      WHERE l.kind = h.kind AND l.unique_key = h.unique_key)
  AND (h.unique_key IS NULL OR h.id = (
      SELECT min(o.id) FROM hopper_job_history AS o
      WHERE o.id IN (SELECT value FROM json_each(%(ids)s))
        AND o.kind = h.kind AND o.unique_key = h.unique_key));

-- name: job_retry_many.history_delete
DELETE FROM hopper_job_history
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND id IN (SELECT id FROM hopper_job);

-- name: job_retry_many.live
UPDATE hopper_job
SET scheduled_at = %(now)s,
    expires_at = NULL,
    snooze_reason = NULL,
    state = CASE WHEN state = 'pending' THEN 'pending' ELSE 'available' END,
    progress = CASE WHEN %(from_start)s THEN NULL ELSE progress END
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND state <> 'running'
RETURNING id;

-- name: job_delete_many
DELETE FROM hopper_job
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND state <> 'running'
RETURNING {job_columns};

-- name: job_delete_many.history
DELETE FROM hopper_job_history
WHERE id IN (SELECT value FROM json_each(%(ids)s))
RETURNING {job_columns_history};

-- name: job_delete_many.logs
DELETE FROM hopper_job_log
WHERE job_id IN (SELECT value FROM json_each(%(ids)s));

-- name: job_delete_many.steps
-- The step ledgers go with the jobs (step results may hold personal data).
DELETE FROM hopper_job_step
WHERE job_id IN (SELECT value FROM json_each(%(ids)s));
