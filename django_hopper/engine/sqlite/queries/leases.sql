-- Job leases of the SQLite engine: claim by ID, renewal, expiry.
--
-- A job claimed by ID runs with no owning client (attempted_by NULL): its lease
-- owns it, named by a random token. SQLite has no UUID function; the engine is
-- embedded, so the token comes from Python's uuid4 in the same process, bound
-- as %(token)s. The lease's TTL is lease_expires_at - lease_renewed_at, which
-- the claim sets and every renewal keeps. Times are fixed-width text; the TTL
-- arithmetic converts them to integer microseconds, exactly:
-- strftime('%s', t) * 1000000 + the six fraction digits (substr(t, 21, 6)).

-- name: job_claim_by_id
-- The claim, when the job is claimable: waiting (whatever its schedule) at
-- %(fence)s, TTL not passed, queue not paused, the head of its ordering key
-- (no job of the key running, none older and not pending). No row: the engine
-- asks job_claim_by_id.status why, in the same transaction.
UPDATE hopper_job
SET state = 'running',
    attempt = attempt + 1,
    fence = fence + 1,
    attempted_at = %(now)s,
    attempted_by = NULL,
    snooze_reason = NULL,
    lease_token = %(token)s,
    lease_renewed_at = %(now)s,
    lease_expires_at = %(expires_at)s,
    metadata = CASE WHEN ordering_key IS NOT NULL
                         AND {wake_marked}
                    THEN json_remove(metadata, '$._hopper_wake') ELSE metadata END
WHERE id = %(id)s
  AND fence = %(fence)s
  AND state IN ('available', 'scheduled', 'retryable')
  AND (expires_at IS NULL OR expires_at > %(now)s)
  AND NOT EXISTS (SELECT 1 FROM hopper_queue AS q
                  WHERE q.name = hopper_job.queue AND q.paused_at IS NOT NULL)
  AND (ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM hopper_job AS o
        WHERE o.queue = hopper_job.queue AND o.ordering_key = hopper_job.ordering_key
          AND o.id <> hopper_job.id
          AND (o.state = 'running' OR (o.state <> 'pending' AND o.id < hopper_job.id))))
RETURNING {job_columns};

-- name: job_claim_by_id.status
-- Why the claim refused: the first rule that applies, in the order not_found,
-- finished, fenced, running, not_claimable.
SELECT CASE WHEN j.id IS NULL
            THEN CASE WHEN EXISTS (SELECT 1 FROM hopper_job_history AS h WHERE h.id = %(id)s)
                      THEN 'finished' ELSE 'not_found' END
            WHEN j.fence <> %(fence)s THEN 'fenced'
            WHEN j.state = 'running' THEN 'running'
            ELSE 'not_claimable' END
FROM (SELECT 1) AS one
LEFT JOIN hopper_job AS j ON j.id = %(id)s;

-- name: job_claim_by_id.busy_timeout
PRAGMA busy_timeout;

-- name: job_claim_by_id.busy_timeout_set
PRAGMA busy_timeout = {ms};

-- name: job_lease_renew
-- Extend the lease by its TTL from now while it is the job's: running at its
-- fence with its token. No expiry test: a renewal succeeds until an expiry is
-- applied (which clears the token), not only until lease_expires_at.
UPDATE hopper_job
SET lease_expires_at = (strftime('%%Y-%%m-%%d %%H:%%M:%%S', ((CAST(strftime('%%s', %(now)s) AS INTEGER) * 1000000 + CAST(substr(%(now)s, 21, 6) AS INTEGER)) + (CAST(strftime('%%s', lease_expires_at) AS INTEGER) * 1000000 + CAST(substr(lease_expires_at, 21, 6) AS INTEGER)) - (CAST(strftime('%%s', lease_renewed_at) AS INTEGER) * 1000000 + CAST(substr(lease_renewed_at, 21, 6) AS INTEGER))) / 1000000, 'unixepoch') || '.' || printf('%%06d', ((CAST(strftime('%%s', %(now)s) AS INTEGER) * 1000000 + CAST(substr(%(now)s, 21, 6) AS INTEGER)) + (CAST(strftime('%%s', lease_expires_at) AS INTEGER) * 1000000 + CAST(substr(lease_expires_at, 21, 6) AS INTEGER)) - (CAST(strftime('%%s', lease_renewed_at) AS INTEGER) * 1000000 + CAST(substr(lease_renewed_at, 21, 6) AS INTEGER))) %% 1000000)),
    lease_renewed_at = %(now)s
WHERE id = %(id)s
  AND state = 'running'
  AND fence = %(fence)s
  AND lease_token = %(token)s
RETURNING lease_expires_at, cancel_requested_at;

-- name: job_expire_leases
-- The leases due. Due at the expiry, or, if a client with a live lease started
-- after the lease was last renewed, no later than the lease's expiry plus
-- %(grace_us)s and no later than now, at the first such start plus the larger
-- of the lease's TTL and %(grace_us)s, when that is later. A start past the
-- expiry plus the grace is no sign the holder could not renew, so clients that
-- keep starting (cron runs, autoscaled workers) never hold a dead lease up.
-- Nothing unless the expiring client's own lease is live.
SELECT {job_columns:j}
FROM hopper_job AS j
WHERE EXISTS (SELECT 1 FROM hopper_client AS me
              WHERE me.id = %(client_id)s AND me.expires_at > %(now)s)
  AND j.state = 'running'
  AND j.lease_token IS NOT NULL
  AND j.lease_expires_at <= %(now)s
  AND coalesce(
        (SELECT (CAST(strftime('%%s', min(cl.started_at)) AS INTEGER) * 1000000 + CAST(substr(min(cl.started_at), 21, 6) AS INTEGER)) FROM hopper_client AS cl
         WHERE cl.expires_at > %(now)s AND cl.started_at > j.lease_renewed_at
           AND cl.started_at <= %(now)s
           AND (CAST(strftime('%%s', cl.started_at) AS INTEGER) * 1000000 + CAST(substr(cl.started_at, 21, 6) AS INTEGER))
               <= (CAST(strftime('%%s', j.lease_expires_at) AS INTEGER) * 1000000 + CAST(substr(j.lease_expires_at, 21, 6) AS INTEGER)) + %(grace_us)s)
        + max((CAST(strftime('%%s', j.lease_expires_at) AS INTEGER) * 1000000 + CAST(substr(j.lease_expires_at, 21, 6) AS INTEGER)) - (CAST(strftime('%%s', j.lease_renewed_at) AS INTEGER) * 1000000 + CAST(substr(j.lease_renewed_at, 21, 6) AS INTEGER)), %(grace_us)s),
        0) <= (CAST(strftime('%%s', %(now)s) AS INTEGER) * 1000000 + CAST(substr(%(now)s, 21, 6) AS INTEGER))
ORDER BY j.lease_expires_at, j.id
LIMIT %(limit)s;
