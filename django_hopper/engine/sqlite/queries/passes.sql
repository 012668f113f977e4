-- Pass leases of resumable runs, SQLite: BEGIN, admission misses, takeover.
--
-- As on PostgreSQL (queries/passes.sql there): BEGIN stamps lease_began_at and
-- leaves the job owned by a pass lease; a claim that never began is an
-- admission miss (admission_misses, NULL = none), never an attempt. Times are
-- the engine's stored text; the engine computes the bounds from its clock in
-- the same IMMEDIATE transaction.

-- fragment: pass_claim
-- The job is running in the claim of %(fence)s, held by the client
-- %(attempted_by)s or by the job lease %(lease_token)s, and has not begun.
state = 'running'
  AND fence = %(fence)s
  AND lease_began_at IS NULL
  AND CASE WHEN %(lease_token)s IS NULL THEN lease_token IS NULL AND attempted_by = %(attempted_by)s
           ELSE lease_token = %(lease_token)s END

-- name: job_pass_begin
-- The commitment point: holds only while the claim owns the job, has not begun,
-- and its lease runs past %(hold_until)s (now + margin); a client's claim leased
-- the job for the TTL from attempted_at, so it must be later than
-- %(claimed_after)s (now + margin - TTL). A client's claim becomes a pass lease
-- (%(token)s), keeping attempted_by; the lease runs to %(expires_at)s.
UPDATE hopper_job
SET lease_token = coalesce(lease_token, %(token)s),
    lease_renewed_at = %(now)s,
    lease_expires_at = %(expires_at)s,
    lease_began_at = %(now)s,
    admission_misses = NULL
WHERE id = %(id)s
  AND {pass_claim}
  AND CASE WHEN lease_expires_at IS NULL THEN attempted_at > %(claimed_after)s
           ELSE lease_expires_at > %(hold_until)s END
RETURNING lease_token, fence, lease_expires_at;

-- name: job_pass_miss
-- Count an admission miss on the claim's row, only while it has not begun.
UPDATE hopper_job
SET admission_misses = coalesce(admission_misses, 0) + 1
WHERE id = %(id)s
  AND {pass_claim}
RETURNING {job_columns}, admission_misses;

-- name: job_pass_takeover_many
-- The pass leases (in %(queue)s, if given) expired by now, or held by a worker
-- whose own client lease expired, oldest expiry first: a begun one whatever its
-- kind, one that never began only of %(kinds)s (a JSON array); a claim that never
-- began counts its miss here. The single writer holds them until the caller's
-- finalize, in the same transaction. The begin is returned as stored (SQLite
-- 3.40 answers `lease_began_at IS NOT NULL` wrongly in a RETURNING clause).
UPDATE hopper_job
SET admission_misses = CASE WHEN lease_began_at IS NULL
                            THEN coalesce(admission_misses, 0) + 1
                            ELSE admission_misses END
WHERE id IN (
    SELECT d.id FROM hopper_job AS d
    WHERE d.lease_expires_at IS NOT NULL
      AND d.state = 'running'
      AND d.lease_token IS NOT NULL
      AND (d.lease_began_at IS NOT NULL OR d.kind IN (SELECT value FROM json_each(%(kinds)s)))
      AND (%(queue)s IS NULL OR d.queue = %(queue)s)
      AND (d.lease_expires_at <= %(now)s
           OR (d.attempted_by IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM hopper_client AS cl
                               WHERE cl.id = d.attempted_by AND cl.expires_at > %(now)s)))
    ORDER BY d.lease_expires_at, d.id
    LIMIT %(limit)s)
RETURNING {job_columns}, lease_began_at, coalesce(admission_misses, 0);

-- name: job_pass_get_many
SELECT id, lease_began_at, coalesce(admission_misses, 0), lease_expires_at
FROM hopper_job
WHERE id IN (SELECT value FROM json_each(%(ids)s));
