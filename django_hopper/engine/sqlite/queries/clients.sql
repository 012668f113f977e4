-- The SQLite engine's queries for clients, the leader and queues.
-- Same conventions as jobs.sql: %(name)s parameters, times as fixed-width UTC text,
-- "now" bound as %(now)s.


-- name: client_register
INSERT INTO hopper_client (hostname, started_at, expires_at, info)
VALUES (%(hostname)s, %(now)s, %(expires_at)s, %(info)s)
RETURNING id;

-- name: client_renew
-- Only an unexpired lease is extended: an expired client has been fenced.
UPDATE hopper_client
SET expires_at = %(expires_at)s, completed = coalesce(%(completed)s, completed)
WHERE id = %(id)s AND expires_at > %(now)s;

-- name: client_renew.control
-- The control state a client re-reads on every renewal, in case it missed a signal.
SELECT 'cancel' AS what, id AS value
FROM hopper_job
WHERE state = 'running' AND attempted_by = %(id)s AND cancel_requested_at IS NOT NULL
UNION ALL
SELECT 'paused', name FROM hopper_queue WHERE paused_at IS NOT NULL
UNION ALL
SELECT 'limited', name
FROM hopper_queue
WHERE global_limit > 0 OR rate_per_sec > 0 OR partition_limit > 0
ORDER BY 1, 2;

-- name: client_delete
DELETE FROM hopper_client WHERE id = %(id)s;

-- name: client_prune_expired
DELETE FROM hopper_client WHERE expires_at <= %(now)s;

-- name: client_list
SELECT id, hostname, started_at, expires_at, info
FROM hopper_client
ORDER BY id;


-- name: leader_attempt
-- Take the lease if it is free or expired, or renew it if held; elected_at changes only
-- when leadership changes hands. A row comes back only if the client leads.
INSERT INTO hopper_leader (name, client_id, elected_at, expires_at)
VALUES ('default', %(client_id)s, %(now)s, %(expires_at)s)
ON CONFLICT (name) DO UPDATE
SET client_id = excluded.client_id,
    elected_at = CASE WHEN hopper_leader.client_id = excluded.client_id
                      THEN hopper_leader.elected_at ELSE excluded.elected_at END,
    expires_at = excluded.expires_at
WHERE hopper_leader.client_id = excluded.client_id OR hopper_leader.expires_at <= %(now)s
RETURNING client_id;

-- name: leader_resign
DELETE FROM hopper_leader WHERE name = 'default' AND client_id = %(client_id)s;

-- name: leader_get
SELECT client_id FROM hopper_leader WHERE name = 'default' AND expires_at > %(now)s;


-- name: queue_ensure
-- %(names)s: a JSON array of queue names; known ones are left alone.
INSERT INTO hopper_queue (name, created_at, updated_at)
SELECT value, %(now)s, %(now)s
FROM json_each(%(names)s)
WHERE true
ON CONFLICT (name) DO NOTHING;

-- name: queue_list
SELECT name, paused_at, updated_at, global_limit, rate_per_sec, rate_burst, partition_limit,
       aging
FROM hopper_queue
ORDER BY name;
