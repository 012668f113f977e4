-- Data-subject queries of the SQLite engine. See the PostgreSQL engine's
-- subjects.sql for the model; here each step is its own statement inside one
-- transaction, which the single writer makes atomic.

-- name: subject_erase
-- The subject's live jobs: (id, was running, batch_id), before they end.
SELECT id, state = 'running', batch_id FROM hopper_job WHERE subject = %(subject)s;

-- name: subject_erase.progress
-- The progress a finalize would record for the batches of the jobs that end.
INSERT INTO hopper_batch_progress (batch_id, done, failed)
SELECT batch_id, count(*), count(*)
FROM hopper_job
WHERE subject = %(subject)s AND batch_id IS NOT NULL
GROUP BY batch_id;

-- name: subject_erase.archive
-- End the subject's live jobs: into history as discarded, data removed, marked erased_at.
INSERT INTO hopper_job_history ({job_columns_history})
SELECT id, kind, queue, 'discarded', priority, attempt, max_attempts, scheduled_at,
       attempted_at, attempted_by, fence, '{}', '{}', '[]', NULL, NULL, NULL, '[]', batch_id,
       expires_at, cancel_requested_at, awaited, created_at, NULL, NULL, NULL, NULL, NULL,
       step, NULL, %(now)s, %(now)s, NULL
FROM hopper_job
WHERE subject = %(subject)s;

-- name: subject_erase.delete
DELETE FROM hopper_job WHERE subject = %(subject)s;

-- name: subject_erase.history
-- Remove the data of the subject's jobs in history.
UPDATE hopper_job_history
SET args = '{}', metadata = '{}', errors = '[]', unique_key = NULL, ordering_key = NULL,
    partition_key = NULL, tags = '[]', snooze_reason = NULL, progress = NULL, output = NULL,
    subject = NULL, erased_at = %(now)s
WHERE subject = %(subject)s
RETURNING id;

-- name: subject_erase.steps
DELETE FROM hopper_job_step WHERE job_id IN (SELECT value FROM json_each(%(ids)s));

-- name: subject_erase.logs
DELETE FROM hopper_job_log WHERE job_id IN (SELECT value FROM json_each(%(ids)s));

-- name: subject_erase.results
-- Empty the outputs their workflows kept for dependents; the state stays.
UPDATE hopper_dependency_result SET output = NULL
WHERE job_id IN (SELECT value FROM json_each(%(ids)s)) AND output IS NOT NULL;

-- name: subject_erase.record
-- That the erasure happened: when, and how many rows; the subject as a digest.
INSERT INTO hopper_erasure (subject_digest, erased_at, jobs, running, steps, logs, results)
VALUES (%(digest)s, %(now)s, %(jobs)s, %(running)s, %(steps)s, %(logs)s, %(results)s)
RETURNING id;
