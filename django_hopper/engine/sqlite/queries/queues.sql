-- Queue controls of the SQLite engine. Times are fixed-width UTC text;
-- aging is a DurationField, stored as microseconds.

-- name: job_claim.lock
-- The limited claim's queue row, its running jobs across all clients (index
-- hopper_job_state) and its token bucket. The claim's IMMEDIATE transaction already
-- holds the write lock, so nobody changes them before the claim ends.
SELECT paused_at IS NOT NULL, global_limit, rate_per_sec, rate_burst, partition_limit, aging,
       rate_tokens, rate_refilled_at,
       (SELECT count(*) FROM hopper_job j WHERE j.state = 'running' AND j.queue = q.name)
FROM hopper_queue q
WHERE name = %(queue)s;

-- name: job_claim.spend
UPDATE hopper_queue
SET rate_tokens = %(tokens)s, rate_refilled_at = %(at)s
WHERE name = %(queue)s;

-- name: job_retry_ordering_key
-- Wake a key: its scheduled/retryable jobs (oldest first, TTL not passed) become
-- available now, keeping their TTL.
UPDATE hopper_job
SET state = 'available', scheduled_at = %(now)s, snooze_reason = NULL
WHERE id IN (
    SELECT id FROM hopper_job
    WHERE queue = %(queue)s AND ordering_key = %(ordering_key)s
      AND state IN ('scheduled', 'retryable')
      AND (expires_at IS NULL OR expires_at > %(now)s)
    ORDER BY id
    LIMIT %(limit)s);

-- name: job_retry_ordering_key.mark
-- A running job of the key: the claim takes it at once if it snoozes or retries.
UPDATE hopper_job
SET metadata = CASE WHEN json_valid(metadata)
                    THEN json_set(coalesce(metadata, '{}'), '$._hopper_wake', json('true'))
                    ELSE metadata END
WHERE queue = %(queue)s AND ordering_key = %(ordering_key)s AND state = 'running';

-- name: job_age
UPDATE hopper_job
SET priority = priority + 1
WHERE queue = %(queue)s
  AND state IN ('available', 'scheduled', 'retryable')
  AND priority < 100
  AND scheduled_at <= %(before)s
  AND (expires_at IS NULL OR expires_at > %(now)s);

-- name: queue_pause
INSERT INTO hopper_queue (name, created_at, updated_at, paused_at)
VALUES (%(name)s, %(now)s, %(now)s, %(now)s)
ON CONFLICT (name) DO UPDATE
SET paused_at = coalesce(hopper_queue.paused_at, excluded.paused_at),
    updated_at = excluded.updated_at;

-- name: queue_resume
INSERT INTO hopper_queue (name, created_at, updated_at, paused_at)
VALUES (%(name)s, %(now)s, %(now)s, NULL)
ON CONFLICT (name) DO UPDATE
SET paused_at = NULL, updated_at = excluded.updated_at;

-- name: queue_set_limits
INSERT INTO hopper_queue (name, created_at, updated_at, global_limit, rate_per_sec,
                          rate_burst, partition_limit, aging)
VALUES (%(name)s, %(now)s, %(now)s, nullif(%(global_limit)s, 0),
        nullif(%(rate_per_sec)s, 0.0), nullif(%(rate_burst)s, 0),
        nullif(%(partition_limit)s, 0), %(aging)s)
ON CONFLICT (name) DO UPDATE
SET global_limit = excluded.global_limit,
    rate_per_sec = excluded.rate_per_sec,
    rate_burst = excluded.rate_burst,
    partition_limit = excluded.partition_limit,
    aging = excluded.aging,
    rate_tokens = NULL,
    rate_refilled_at = NULL,
    updated_at = excluded.updated_at
RETURNING name, paused_at, updated_at, global_limit, rate_per_sec, rate_burst, partition_limit,
          aging;

-- name: queue_get
SELECT name, paused_at, updated_at, global_limit, rate_per_sec, rate_burst, partition_limit,
       aging
FROM hopper_queue
WHERE name = %(name)s;
