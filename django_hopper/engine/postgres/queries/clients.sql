-- Client, leader, queue and notification queries of the PostgreSQL engine.

-- name: client_register
INSERT INTO hopper_client (hostname, started_at, expires_at, info)
SELECT %(hostname)s, c.now, c.now + %(ttl)s::interval, %(info)s::jsonb
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) c
RETURNING id

-- name: client_renew
-- Extend an unexpired lease, and read the control state the client re-reads
-- on every renewal in case a notification was missed.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
renewed AS (
    UPDATE hopper_client cl
    SET expires_at = c.now + %(ttl)s::interval,
        completed = coalesce(%(completed)s::jsonb, cl.completed)
    FROM clock c
    WHERE cl.id = %(client_id)s AND cl.expires_at > c.now
    RETURNING cl.id
)
SELECT EXISTS (SELECT 1 FROM renewed),
       ARRAY(SELECT j.id FROM hopper_job j
             WHERE j.state = 'running' AND j.attempted_by = %(client_id)s
               AND j.cancel_requested_at IS NOT NULL
             ORDER BY j.id),
       ARRAY(SELECT q.name FROM hopper_queue q WHERE q.paused_at IS NOT NULL ORDER BY q.name),
       ARRAY(SELECT q.name FROM hopper_queue q
             WHERE q.global_limit > 0 OR q.rate_per_sec > 0 OR q.partition_limit > 0
             ORDER BY q.name)

-- name: client_delete
DELETE FROM hopper_client WHERE id = %(client_id)s

-- name: client_prune_expired
DELETE FROM hopper_client WHERE expires_at <= coalesce(%(now)s::timestamptz, now())

-- name: client_list
SELECT id, hostname, started_at, expires_at, info FROM hopper_client ORDER BY id

-- name: leader_attempt
-- Take the lease if it is free or expired, or renew it if held; the row comes
-- back only if the client leads afterwards. elected_at changes with the holder.
INSERT INTO hopper_leader AS l (name, client_id, elected_at, expires_at)
SELECT 'default', %(client_id)s, c.now, c.now + %(ttl)s::interval
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) c
ON CONFLICT (name) DO UPDATE
SET client_id = excluded.client_id,
    elected_at = CASE WHEN l.client_id = excluded.client_id THEN l.elected_at
                      ELSE excluded.elected_at END,
    expires_at = excluded.expires_at
WHERE l.client_id = excluded.client_id OR l.expires_at <= excluded.elected_at
RETURNING l.client_id

-- name: leader_resign
-- Give the lease up if held, and tell the other clients to elect.
WITH resigned AS (
    DELETE FROM hopper_leader WHERE name = 'default' AND client_id = %(client_id)s
    RETURNING client_id
)
SELECT pg_notify(%(channel)s, %(payload)s) FROM resigned

-- name: leader_get
SELECT client_id FROM hopper_leader
WHERE name = 'default' AND expires_at > coalesce(%(now)s::timestamptz, now())

-- name: queue_ensure
INSERT INTO hopper_queue (name, created_at, updated_at)
SELECT n.name, c.now, c.now
FROM unnest(%(names)s::text[]) AS n(name)
CROSS JOIN (SELECT coalesce(%(now)s::timestamptz, now()) AS now) c
ORDER BY n.name
ON CONFLICT (name) DO NOTHING

-- name: queue_list
SELECT name, paused_at, updated_at, global_limit, rate_per_sec, rate_burst, partition_limit,
       aging
FROM hopper_queue
ORDER BY name

-- name: notify
-- One statement for every payload; delivered when the transaction commits.
SELECT count(pg_notify(%(channel)s, p)) FROM unnest(%(payloads)s::text[]) AS p

-- name: listener.listen
-- The channel is an identifier, quoted by psycopg.sql before it is sent.
LISTEN {channel}

-- name: listener.route
-- The port the server itself listens on (NULL over a Unix socket): another
-- port than the client connected to means a proxy, such as PgBouncer, between.
SELECT inet_server_port()
