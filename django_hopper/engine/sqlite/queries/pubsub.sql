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
SELECT name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at
FROM hopper_subscription
ORDER BY name;

-- name: message_publish
-- The subscriptions a publish matches against (a small table).
SELECT name, pattern, kind, queue, max_attempts, metadata, created_at, updated_at
FROM hopper_subscription
ORDER BY name;
