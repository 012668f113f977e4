-- The step ledger of resumable jobs (hopper_job_step), PostgreSQL.
--
-- Every statement is conditional on the claim that makes it, tested as the
-- finalize tests it: running at %(fence)s, owned by %(attempted_by)s, or by
-- the job lease %(lease_token)s. A step boundary of a leased job renews the
-- lease by its TTL (lease_expires_at - lease_renewed_at) in the same
-- statement. `result` is NULL until the step succeeds, then {"value": ...}.

-- fragment: held_by_claim
-- The job j is running in the claim of %(fence)s, held by the client
-- %(attempted_by)s or by the job lease %(lease_token)s (as the finalize tests it).
j.state = 'running'
      AND j.fence = %(fence)s
      AND CASE WHEN %(lease_token)s::uuid IS NULL
               THEN j.lease_token IS NULL AND j.attempted_by = %(attempted_by)s::int8
               ELSE j.lease_token = %(lease_token)s::uuid END

-- fragment: lease_renewed
-- A step boundary of a leased job (`owner`) renews its lease by its TTL.
renewed AS (
    UPDATE hopper_job j
    SET lease_expires_at = c.now + (j.lease_expires_at - j.lease_renewed_at),
        lease_renewed_at = c.now
    FROM owner o CROSS JOIN clock c
    WHERE j.id = o.id AND o.lease_token IS NOT NULL
)

-- name: job_step_get
-- `held` is false when the claim lost the job; the step's row follows, if any.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
owner AS (
    SELECT j.id, j.lease_token
    FROM hopper_job j
    WHERE j.id = %(id)s::uuid
      AND {held_by_claim}
),
{lease_renewed}
SELECT EXISTS (SELECT 1 FROM owner) AS held, s.job_id, s.step, s.result, s.attempts,
       s.last_error, s.recorded_at
FROM (SELECT 1) one
LEFT JOIN hopper_job_step s
  ON s.job_id = %(id)s::uuid AND s.step = %(step)s AND EXISTS (SELECT 1 FROM owner)

-- name: job_step_record
-- One try of a step: attempts + 1; a result, once stored, is kept; the
-- latest error is kept. Nothing is written (no row) when the claim lost the job.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
owner AS (
    SELECT j.id, j.lease_token
    FROM hopper_job j
    WHERE j.id = %(id)s::uuid
      AND {held_by_claim}
    FOR UPDATE
),
{lease_renewed}
INSERT INTO hopper_job_step AS s (job_id, step, result, attempts, last_error, recorded_at)
SELECT o.id, %(step)s, %(result)s::jsonb, 1, %(error)s, c.now
FROM owner o CROSS JOIN clock c
ON CONFLICT (job_id, step) DO UPDATE
SET result = coalesce(s.result, EXCLUDED.result),
    attempts = s.attempts + 1,
    last_error = coalesce(EXCLUDED.last_error, s.last_error),
    recorded_at = EXCLUDED.recorded_at
RETURNING s.job_id, s.step, s.result, s.attempts, s.last_error, s.recorded_at

-- name: job_steps_clear
-- Drop the ledger as the claim that owns the job (and, with reset_attempt,
-- set its attempt to 1, so the snooze ending a committed pass gives it back
-- to 0). `held` false: nothing was dropped.
WITH owner AS (
    SELECT j.id
    FROM hopper_job j
    WHERE j.id = %(id)s::uuid
      AND {held_by_claim}
    FOR UPDATE
),
reset AS (
    UPDATE hopper_job j
    SET attempt = 1
    FROM owner o
    WHERE j.id = o.id AND %(reset_attempt)s
),
gone AS (
    DELETE FROM hopper_job_step s
    USING owner o
    WHERE s.job_id = o.id
    RETURNING s.id
)
SELECT EXISTS (SELECT 1 FROM owner) AS held, (SELECT count(*) FROM gone) AS dropped

-- name: job_steps
SELECT s.job_id, s.step, s.result, s.attempts, s.last_error, s.recorded_at
FROM hopper_job_step s
WHERE s.job_id = %(id)s::uuid
ORDER BY s.id
