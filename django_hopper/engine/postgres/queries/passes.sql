-- Pass leases of resumable runs, PostgreSQL: BEGIN, admission misses, takeover.
--
-- A pass is one attempt of a resumable job. Its claim (a client's, or a job
-- lease's from job_claim_by_id) runs nothing until BEGIN writes: BEGIN stamps
-- lease_began_at and leaves the job owned by a pass lease (lease_token,
-- lease_renewed_at, lease_expires_at, renewed at each step boundary). A claim
-- that never began is an admission miss (admission_misses, NULL = none), never
-- an attempt. The caller's claim is tested as the finalize tests it.

-- fragment: pass_claim
-- The job j is running in the claim of %(fence)s, held by the client
-- %(attempted_by)s or by the job lease %(lease_token)s, and has not begun.
j.state = 'running'
      AND j.fence = %(fence)s
      AND j.lease_began_at IS NULL
      AND CASE WHEN %(lease_token)s::uuid IS NULL
               THEN j.lease_token IS NULL AND j.attempted_by = %(attempted_by)s::int8
               ELSE j.lease_token = %(lease_token)s::uuid END

-- name: job_pass_begin
-- The commitment point: holds only while the claim owns the job, has not begun,
-- and its lease runs more than %(margin)s past now (a client's claim leased the
-- job for %(ttl)s from attempted_at). A client's claim becomes a pass lease
-- (a token made here), keeping attempted_by; the lease runs %(ttl)s from now.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE hopper_job j
SET lease_token = coalesce(j.lease_token, gen_random_uuid()),
    lease_renewed_at = c.now,
    lease_expires_at = c.now + %(ttl)s::interval,
    lease_began_at = c.now,
    admission_misses = NULL
FROM clock c
WHERE j.id = %(id)s::uuid
  AND {pass_claim}
  AND coalesce(j.lease_expires_at, j.attempted_at + %(ttl)s::interval)
      > c.now + %(margin)s::interval
RETURNING j.lease_token, j.fence, j.lease_expires_at

-- name: job_pass_miss
-- Count an admission miss on the claim's row, only while it has not begun; the
-- caller ends the claim (fenced, in the same transaction) as the count says.
UPDATE hopper_job j
SET admission_misses = coalesce(j.admission_misses, 0) + 1
WHERE j.id = %(id)s::uuid
  AND {pass_claim}
RETURNING {job_columns:j}, j.admission_misses

-- name: job_pass_takeover_many
-- The pass leases (in %(queue)s, if given) expired by now, or held by a worker
-- whose own client lease expired (its process is gone, the pass with it), locked
-- (SKIP LOCKED: a holder renewing is left alone), oldest expiry first. A begun
-- pass lease is one whatever its kind; a lease that never began is one only for
-- %(kinds)s (a claim by ID of another kind is an ordinary job lease, which
-- job_expire_leases governs). Leased jobs are few: the partial index
-- hopper_job_lease holds exactly them. A claim that never began counts its miss here; the caller
-- ends each attempt, fenced to its lease, in the same transaction.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
due AS (
    SELECT j.id
    FROM hopper_job j CROSS JOIN clock c
    WHERE j.lease_expires_at IS NOT NULL
      AND j.state = 'running'
      AND j.lease_token IS NOT NULL
      AND (j.lease_began_at IS NOT NULL OR j.kind = ANY (%(kinds)s::text[]))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (j.lease_expires_at <= c.now
           OR (j.attempted_by IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM hopper_client cl
                               WHERE cl.id = j.attempted_by AND cl.expires_at > c.now)))
    ORDER BY j.lease_expires_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE hopper_job j
SET admission_misses = CASE WHEN j.lease_began_at IS NULL
                            THEN coalesce(j.admission_misses, 0) + 1
                            ELSE j.admission_misses END
FROM due d
WHERE j.id = d.id
RETURNING {job_columns:j}, j.lease_began_at, coalesce(j.admission_misses, 0)

-- name: job_pass_get_many
SELECT j.id, j.lease_began_at, coalesce(j.admission_misses, 0), j.lease_expires_at
FROM hopper_job j
WHERE j.id = ANY(%(ids)s::uuid[])
