-- The step ledger of resumable jobs (hopper_job_step), SQLite.
--
-- Every operation is conditional on the claim that makes it, tested as the
-- finalize tests it: running at %(fence)s, owned by %(attempted_by)s, or by the
-- job lease %(lease_token)s. The engine runs an operation's statements in one
-- IMMEDIATE transaction, so the test and the write see the same job. A step
-- boundary of a leased job renews the lease by its TTL (as job_lease_renew).
-- `result` is NULL until the step succeeds, then {"value": ...}.

-- name: job_step_get
-- The claim's test, renewing a lease: a row (the job's id) when the claim owns
-- the job. Client claims write nothing (the SET is the identity for them).
UPDATE hopper_job
SET lease_expires_at = CASE WHEN lease_token IS NULL THEN lease_expires_at
                            ELSE (strftime('%%Y-%%m-%%d %%H:%%M:%%S', ((CAST(strftime('%%s', %(now)s) AS INTEGER) * 1000000 + CAST(substr(%(now)s, 21, 6) AS INTEGER)) + (CAST(strftime('%%s', lease_expires_at) AS INTEGER) * 1000000 + CAST(substr(lease_expires_at, 21, 6) AS INTEGER)) - (CAST(strftime('%%s', lease_renewed_at) AS INTEGER) * 1000000 + CAST(substr(lease_renewed_at, 21, 6) AS INTEGER))) / 1000000, 'unixepoch') || '.' || printf('%%06d', ((CAST(strftime('%%s', %(now)s) AS INTEGER) * 1000000 + CAST(substr(%(now)s, 21, 6) AS INTEGER)) + (CAST(strftime('%%s', lease_expires_at) AS INTEGER) * 1000000 + CAST(substr(lease_expires_at, 21, 6) AS INTEGER)) - (CAST(strftime('%%s', lease_renewed_at) AS INTEGER) * 1000000 + CAST(substr(lease_renewed_at, 21, 6) AS INTEGER))) %% 1000000)) END,
    lease_renewed_at = CASE WHEN lease_token IS NULL THEN lease_renewed_at
                            ELSE %(now)s END
WHERE id = %(id)s
  AND state = 'running'
  AND fence = %(fence)s
  AND CASE WHEN %(lease_token)s IS NULL THEN lease_token IS NULL AND attempted_by = %(attempted_by)s
           ELSE lease_token = %(lease_token)s END
RETURNING id;

-- name: job_step_get.read
SELECT job_id, step, result, attempts, last_error, recorded_at
FROM hopper_job_step
WHERE job_id = %(id)s AND step = %(step)s;

-- name: job_step_record
-- One try of a step, inserted only while the claim owns the job: attempts + 1;
-- a result, once stored, is kept; the latest error is kept.
INSERT INTO hopper_job_step (job_id, step, result, attempts, last_error, recorded_at)
SELECT %(id)s, %(step)s, %(result)s, 1, %(error)s, %(now)s
WHERE EXISTS (SELECT 1 FROM hopper_job WHERE id = %(id)s
  AND state = 'running'
  AND fence = %(fence)s
  AND CASE WHEN %(lease_token)s IS NULL THEN lease_token IS NULL AND attempted_by = %(attempted_by)s
           ELSE lease_token = %(lease_token)s END)
ON CONFLICT (job_id, step) DO UPDATE
SET result = coalesce(hopper_job_step.result, excluded.result),
    attempts = hopper_job_step.attempts + 1,
    last_error = coalesce(excluded.last_error, hopper_job_step.last_error),
    recorded_at = excluded.recorded_at
RETURNING job_id, step, result, attempts, last_error, recorded_at;

-- name: job_steps_clear
-- The claim's test (and, with reset_attempt, attempt = 1, so that the snooze
-- ending a committed pass gives it back to 0); a row when the claim owns the job.
UPDATE hopper_job
SET attempt = CASE WHEN %(reset_attempt)s THEN 1 ELSE attempt END
WHERE id = %(id)s
  AND state = 'running'
  AND fence = %(fence)s
  AND CASE WHEN %(lease_token)s IS NULL THEN lease_token IS NULL AND attempted_by = %(attempted_by)s
           ELSE lease_token = %(lease_token)s END
RETURNING id;

-- name: job_steps_clear.delete
DELETE FROM hopper_job_step WHERE job_id = %(id)s;

-- name: job_steps
SELECT job_id, step, result, attempts, last_error, recorded_at
FROM hopper_job_step
WHERE job_id = %(id)s
ORDER BY id;
