-- Queue controls of the PostgreSQL engine: the limited claim's queue
-- row, ordering keys, aging, pause, resume and limits.

-- name: job_claim.lock
-- The limited claim's first statement: lock the queue row (claims of a limited
-- queue serialize here) and read its limits, its token bucket and the clock.
-- The running count is a statement of its own: a subquery here would read the
-- snapshot taken before the lock wait, missing the claims of the holder.
SELECT q.paused_at IS NOT NULL, q.global_limit, q.rate_per_sec, q.rate_burst,
       q.partition_limit, q.aging, q.rate_tokens, q.rate_refilled_at,
       coalesce(%(now)s::timestamptz, now())
FROM hopper_queue q
WHERE q.name = %(queue)s
FOR UPDATE OF q

-- name: job_claim.running
-- Running jobs of the queue across all clients (index hopper_job_state), read
-- after the lock so that every earlier limited claim is visible.
SELECT count(*) FROM hopper_job WHERE state = 'running' AND queue = %(queue)s

-- name: job_claim.spend
-- The limited claim's last statement: store the bucket as the claim left it.
UPDATE hopper_queue
SET rate_tokens = %(tokens)s, rate_refilled_at = %(at)s
WHERE name = %(queue)s

-- name: job_retry_ordering_key
-- Wake a key: its scheduled/retryable jobs (oldest first, TTL not passed) become
-- available now, keeping their TTL; a running job of the key is marked so that
-- the claim takes it at once if its attempt ends in a snooze or a retry.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
waiting AS (
    SELECT j.id
    FROM hopper_job j, clock c
    WHERE j.queue = %(queue)s AND j.ordering_key = %(ordering_key)s
      AND j.state IN ('scheduled', 'retryable')
      AND (j.expires_at IS NULL OR j.expires_at > c.now)
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j
),
woken AS (
    UPDATE hopper_job j
    SET state = 'available', scheduled_at = c.now, snooze_reason = NULL
    FROM waiting w, clock c
    WHERE j.id = w.id
    RETURNING j.id
),
marked AS (
    UPDATE hopper_job j
    SET metadata = j.metadata || '{"_hopper_wake": true}'::jsonb
    WHERE j.queue = %(queue)s AND j.ordering_key = %(ordering_key)s AND j.state = 'running'
    RETURNING j.id
)
SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM marked)

-- name: job_age
-- One priority level more (up to 100) for jobs claimable for longer than `after`:
-- available, or scheduled/retryable and due, since scheduled_at.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE hopper_job j
SET priority = j.priority + 1
FROM clock c
WHERE j.queue = %(queue)s
  AND j.state IN ('available', 'scheduled', 'retryable')
  AND j.priority < 100
  AND j.scheduled_at <= c.now - %(after)s::interval
  AND (j.expires_at IS NULL OR j.expires_at > c.now)

-- name: queue_pause
INSERT INTO hopper_queue AS q (name, created_at, updated_at, paused_at)
SELECT %(name)s, c.now, c.now, c.now
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) c
ON CONFLICT (name) DO UPDATE
SET paused_at = coalesce(q.paused_at, excluded.paused_at), updated_at = excluded.updated_at

-- name: queue_resume
INSERT INTO hopper_queue AS q (name, created_at, updated_at, paused_at)
SELECT %(name)s, c.now, c.now, NULL
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) c
ON CONFLICT (name) DO UPDATE
SET paused_at = NULL, updated_at = excluded.updated_at

-- name: queue_set_limits
-- Zero is stored as NULL (no limit); the token bucket starts full again.
INSERT INTO hopper_queue AS q (name, created_at, updated_at, global_limit, rate_per_sec,
                               rate_burst, partition_limit, aging)
SELECT %(name)s, c.now, c.now, nullif(%(global_limit)s, 0), nullif(%(rate_per_sec)s, 0.0),
       nullif(%(rate_burst)s, 0), nullif(%(partition_limit)s, 0), %(aging)s::interval
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) c
ON CONFLICT (name) DO UPDATE
SET global_limit = excluded.global_limit,
    rate_per_sec = excluded.rate_per_sec,
    rate_burst = excluded.rate_burst,
    partition_limit = excluded.partition_limit,
    aging = excluded.aging,
    rate_tokens = NULL,
    rate_refilled_at = NULL,
    updated_at = excluded.updated_at
RETURNING q.name, q.paused_at, q.updated_at, q.global_limit, q.rate_per_sec, q.rate_burst,
          q.partition_limit, q.aging

-- name: queue_get
SELECT name, paused_at, updated_at, global_limit, rate_per_sec, rate_burst, partition_limit,
       aging
FROM hopper_queue
WHERE name = %(name)s
