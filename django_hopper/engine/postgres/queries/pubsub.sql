-- Pub/sub queries of the PostgreSQL engine: subscriptions and publishing.
--
-- A publish reads the subscriptions, matches their patterns against the topic
-- in Python (django_hopper.engine.topics, shared with SQLite), and inserts the
-- deliveries with job_insert_many's one statement, in the caller's transaction.

-- name: subscription_upsert
-- Upsert by name; the rows arrive as one array per column, names distinct.
INSERT INTO hopper_subscription AS s
    (name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at)
SELECT r.name, r.pattern, r.kind, r.queue, r.max_attempts, r.metadata::jsonb, c.now, c.now
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS c,
     unnest(%(names)s::text[], %(patterns)s::text[], %(kinds)s::text[], %(queues)s::text[],
            %(max_attempts)s::int[], %(metadata)s::text[])
         AS r(name, pattern, kind, queue, max_attempts, metadata)
ON CONFLICT (name) DO UPDATE
SET pattern = excluded.pattern,
    kind = excluded.kind,
    queue = excluded.queue,
    max_attempts = excluded.max_attempts,
    metadata = excluded.metadata,
    updated_at = excluded.updated_at

-- name: subscription_list
SELECT name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at
FROM hopper_subscription
ORDER BY name

-- name: message_publish
-- The subscriptions a publish matches against (a small table), with the clock
-- a delayed publish schedules from.
SELECT s.name, s.pattern, s.kind, s.queue, s.max_attempts, s.metadata, s.created_at,
       s.updated_at, s.paused_at, c.now
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS c
LEFT JOIN hopper_subscription AS s ON true
ORDER BY s.name

-- name: subscription_pause
-- A paused subscription stays paused from its first pause.
UPDATE hopper_subscription
SET paused_at = coalesce(paused_at, coalesce(%(now)s::timestamptz, now())),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at

-- name: subscription_resume
UPDATE hopper_subscription
SET paused_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at

-- name: subscription_resume.release
-- The deliveries held while paused become due now: the claim of their queue (or
-- the leader's scheduler) makes them available. Held ones sit at %(held_at)s,
-- past every real schedule (index hopper_job_promote reaches them by time).
UPDATE hopper_job
SET scheduled_at = coalesce(%(now)s::timestamptz, now())
WHERE state = 'scheduled'
  AND scheduled_at >= %(held_at)s
  AND metadata ->> 'subscription' = %(name)s
RETURNING queue

-- name: subscription_delete
DELETE FROM hopper_subscription
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at

-- name: subscription_delete.waiting
-- The subscription's deliveries not running: waiting, scheduled, retrying or held.
SELECT id FROM hopper_job
WHERE state <> 'running'
  AND metadata ->> 'subscription' = %(name)s
ORDER BY id
