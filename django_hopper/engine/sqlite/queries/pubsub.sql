-- Pub/sub queries of the SQLite engine: subscriptions and publishing.
--
-- A publish reads the subscriptions, matches their patterns against the topic
-- in Python (django_hopper.engine.topics, shared with PostgreSQL), and inserts
-- the deliveries with job_insert_many, in the caller's transaction.

-- name: subscription_upsert
-- One row per execution (executemany), in one transaction.
INSERT INTO hopper_subscription
    (name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at)
VALUES (%(name)s, %(pattern)s, %(kind)s, %(queue)s, %(max_attempts)s, %(metadata)s,
        %(now)s, %(now)s)
ON CONFLICT (name) DO UPDATE
SET pattern = excluded.pattern,
    kind = excluded.kind,
    queue = excluded.queue,
    max_attempts = excluded.max_attempts,
    metadata = excluded.metadata,
    updated_at = excluded.updated_at;

-- name: subscription_list
SELECT name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at
FROM hopper_subscription
ORDER BY name;

-- name: message_publish
-- The subscriptions a publish matches against (a small table).
SELECT name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at
FROM hopper_subscription
ORDER BY name;

-- name: subscription_pause
-- A paused subscription stays paused from its first pause.
UPDATE hopper_subscription
SET paused_at = coalesce(paused_at, %(now)s),
    updated_at = %(now)s
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at;

-- name: subscription_resume
UPDATE hopper_subscription
SET paused_at = NULL,
    updated_at = %(now)s
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at;

-- name: subscription_resume.release
-- The deliveries held while paused become due now: the claim of their queue (or
-- the leader's scheduler) makes them available. Held ones sit at %(held_at)s,
-- past every real schedule.
UPDATE hopper_job
SET scheduled_at = %(now)s
WHERE state = 'scheduled'
  AND scheduled_at >= %(held_at)s
  AND CASE WHEN json_valid(metadata) AND json_type(metadata) = 'object'
           THEN json_extract(metadata, '$.subscription') END = %(name)s
RETURNING queue;

-- name: subscription_delete
DELETE FROM hopper_subscription
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at, paused_at;

-- name: subscription_delete.waiting
-- The subscription's deliveries not running: waiting, scheduled, retrying or held.
SELECT id FROM hopper_job
WHERE state <> 'running'
  AND CASE WHEN json_valid(metadata) AND json_type(metadata) = 'object'
           THEN json_extract(metadata, '$.subscription') END = %(name)s
ORDER BY id;
