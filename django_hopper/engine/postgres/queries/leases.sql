-- Job leases of the PostgreSQL engine: claim by ID, renewal, expiry.
--
-- A job claimed by ID runs with no owning client (attempted_by NULL): its lease
-- owns it, named by a random token gen_random_uuid() makes in the statement.
-- The lease's TTL is never stored apart: it is lease_expires_at -
-- lease_renewed_at, which the claim sets to %(ttl)s and every renewal keeps.

-- name: job_claim_by_id.lock
-- variant: job_claim_by_id.lock.no_wait NO_WAIT
-- Wait for the row if another transaction holds it; the claim statement that
-- follows then reads it as committed. The no_wait variant refuses to wait
-- (lock_not_available, which the engine reports as JobLocked).
SELECT j.id FROM hopper_job j WHERE j.id = %(id)s::uuid FOR UPDATE/*IF NO_WAIT*/ NOWAIT/*END*/

-- name: job_claim_by_id
-- The claim and its refusal in one statement: `status` names the first rule
-- that applies, in this order (not_found, finished, fenced, running,
-- not_claimable), or `claimed` with the job as claimed. Claimable: waiting
-- (whatever its schedule), TTL not passed, queue not paused, and the head of
-- its ordering key (no job of the key running, none older and not pending).
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
target AS (SELECT j.* FROM hopper_job j WHERE j.id = %(id)s::uuid),
claimable AS (
    SELECT t.id
    FROM target t CROSS JOIN clock c
    WHERE t.fence = %(fence)s
      AND t.state IN ('available', 'scheduled', 'retryable')
      AND (t.expires_at IS NULL OR t.expires_at > c.now)
      AND NOT EXISTS (SELECT 1 FROM hopper_queue q
                      WHERE q.name = t.queue AND q.paused_at IS NOT NULL)
      AND (t.ordering_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM hopper_job o
            WHERE o.queue = t.queue AND o.ordering_key = t.ordering_key AND o.id <> t.id
              AND (o.state = 'running' OR (o.state <> 'pending' AND o.id < t.id))))
),
claimed AS (
    UPDATE hopper_job j
    SET state = 'running',
        attempt = j.attempt + 1,
        fence = j.fence + 1,
        attempted_at = c.now,
        attempted_by = NULL,
        snooze_reason = NULL,
        lease_token = gen_random_uuid(),
        lease_renewed_at = c.now,
        lease_expires_at = c.now + %(ttl)s::interval,
        metadata = CASE WHEN j.ordering_key IS NOT NULL AND j.metadata ? '_hopper_wake'
                             AND jsonb_typeof(j.metadata) = 'object'
                        THEN j.metadata - '_hopper_wake' ELSE j.metadata END
    FROM claimable k CROSS JOIN clock c
    WHERE j.id = k.id
    RETURNING {job_columns:j}
)
SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM target)
            THEN CASE WHEN EXISTS (SELECT 1 FROM hopper_job_history h
                                   WHERE h.id = %(id)s::uuid)
                      THEN 'finished' ELSE 'not_found' END
            WHEN (SELECT t.fence FROM target t) <> %(fence)s THEN 'fenced'
            WHEN (SELECT t.state FROM target t) = 'running' THEN 'running'
            WHEN EXISTS (SELECT 1 FROM claimed) THEN 'claimed'
            ELSE 'not_claimable' END AS status,
       cl.*
FROM (SELECT 1) one
LEFT JOIN claimed cl ON true

-- name: job_lease_renew
-- Extend the lease by its TTL from now while it is the job's: running at its
-- fence with its token. No expiry test: a renewal succeeds until an expiry is
-- applied (which clears the token), not only until lease_expires_at.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE hopper_job j
SET lease_expires_at = c.now + (j.lease_expires_at - j.lease_renewed_at),
    lease_renewed_at = c.now
FROM clock c
WHERE j.id = %(id)s::uuid
  AND j.state = 'running'
  AND j.fence = %(fence)s
  AND j.lease_token = %(token)s::uuid
RETURNING j.lease_expires_at, j.cancel_requested_at IS NOT NULL

-- name: job_expire_leases
-- The leases due, locked (SKIP LOCKED: a holder renewing is left alone). Due
-- at the expiry, or, if a client with a live lease started after the lease
-- was last renewed, no later than the lease's expiry plus %(grace)s and no
-- later than now, at the first such start plus the larger of the lease's TTL
-- and %(grace)s, when that is later. A start past the expiry plus the grace is
-- no sign the holder could not renew, so clients that keep starting (cron runs,
-- autoscaled workers) never hold a dead lease up. Nothing unless the expiring
-- client's own lease is live.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT {job_columns:j}
FROM hopper_job j
CROSS JOIN clock c
WHERE EXISTS (SELECT 1 FROM hopper_client me
              WHERE me.id = %(client_id)s AND me.expires_at > c.now)
  AND j.state = 'running'
  AND j.lease_token IS NOT NULL
  AND j.lease_expires_at <= c.now
  AND coalesce(
        (SELECT min(cl.started_at) FROM hopper_client cl
         WHERE cl.expires_at > c.now AND cl.started_at > j.lease_renewed_at
           AND cl.started_at <= c.now
           AND cl.started_at <= j.lease_expires_at + %(grace)s::interval)
        + greatest(j.lease_expires_at - j.lease_renewed_at, %(grace)s::interval),
        j.lease_expires_at) <= c.now
ORDER BY j.lease_expires_at, j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED
