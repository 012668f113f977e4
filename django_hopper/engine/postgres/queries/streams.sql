-- Stream queries of the PostgreSQL engine: the event log and its consumers.
--
-- An event records the id of the transaction that appended it (xid8, as a
-- bigint). A consumer records a pg_snapshot: every transaction visible in it
-- has been delivered, and position (xid, seq) names the last event delivered
-- of a transaction delivered in part. A pump delivers the events of the
-- transactions visible in the statement's own snapshot and not in the stored
-- one: a transaction that commits late is simply not visible yet, and will be
-- in a later pump's snapshot, whatever its seq (docs/pubsub-and-streams.md).

-- name: stream_append
WITH ins AS (
    INSERT INTO hopper_stream_event (xid, topic, key, payload, headers, message_id, created_at)
    VALUES (pg_current_xact_id()::text::bigint, %(topic)s, %(key)s, %(payload)s::jsonb,
            %(headers)s::jsonb, %(message_id)s, coalesce(%(now)s::timestamptz, now()))
    RETURNING seq, xid, topic, created_at
),
sent AS (
    SELECT count(pg_notify(%(channel)s, ins.topic)) AS n FROM ins WHERE %(notify)s
)
SELECT ins.seq, ins.xid, ins.created_at FROM ins, sent

-- name: stream_read
-- Committed events after a position, in position order (index hopper_stream_position).
SELECT seq, xid, topic, key, payload, headers, message_id, created_at
FROM hopper_stream_event
WHERE (xid, seq) > (%(xid)s, %(seq)s)
  AND topic ~ %(regex)s
ORDER BY xid, seq
LIMIT %(limit)s

-- name: stream_consumer_upsert.snapshot
-- The current snapshot and transaction: what "latest" means now. The caller's own
-- transaction has not committed, so it must not count as read (see Snapshot.without).
SELECT pg_current_snapshot()::text, pg_current_xact_id_if_assigned()::text::bigint

-- name: stream_consumer_upsert
-- A new consumer starts with a snapshot: "1:1:" sees no transaction (earliest),
-- %(latest)s every transaction committed so far (latest).
INSERT INTO hopper_stream_consumer AS s
    (name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
     position_seq, delivered_at, created_at, updated_at)
SELECT r.name, r.pattern, r.kind, r.queue, r.max_attempts, r.metadata::jsonb, r.start,
       CASE WHEN r.start = 'earliest' THEN '1:1:' ELSE %(latest)s END,
       0, 0, NULL, c.now, c.now
FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS c,
     unnest(%(names)s::text[], %(patterns)s::text[], %(kinds)s::text[], %(queues)s::text[],
            %(max_attempts)s::int[], %(metadata)s::text[], %(starts)s::text[])
         AS r(name, pattern, kind, queue, max_attempts, metadata, start)
ON CONFLICT (name) DO UPDATE
SET pattern = excluded.pattern,
    kind = excluded.kind,
    queue = excluded.queue,
    max_attempts = excluded.max_attempts,
    metadata = excluded.metadata,
    updated_at = excluded.updated_at

-- name: stream_consumer_list
SELECT name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
       position_seq, delivered_at, created_at, updated_at, paused_at
FROM hopper_stream_consumer
ORDER BY name

-- name: stream_consumer_seek
UPDATE hopper_stream_consumer
SET snapshot = %(snapshot)s,
    position_xid = %(xid)s,
    position_seq = %(seq)s,
    updated_at = now()
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at

-- name: stream_consumer_seek.time
-- The first event appended at or after a time, in position order.
SELECT xid, seq
FROM hopper_stream_event
WHERE created_at >= %(time)s
ORDER BY xid, seq
LIMIT 1

-- name: stream_pump
-- Lock the consumer: a second pump of it waits here, then reads what the
-- first one stored.
SELECT name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
       position_seq, delivered_at, created_at, updated_at, paused_at
FROM hopper_stream_consumer
WHERE name = %(name)s
FOR UPDATE

-- name: stream_pump.events
-- The delta, in the statement's snapshot (returned first, to be stored, with the
-- pump's own transaction id): events of transactions committed in it and not in
-- the stored snapshot, less those of the position's transaction already
-- delivered. The rest of the position's transaction comes first, then the others
-- in position order: a pump that stops inside a transaction has finished the one
-- before, so one position always says what is delivered in part. The pump's own
-- transaction is not committed, whatever the snapshot says of it, so its events
-- wait for a later pump. Nothing below the stored xmin can be in the delta, which
-- bounds the index scans.
SELECT c.snap::text, c.own, e.seq, e.xid, e.topic, e.key, e.payload, e.headers,
       e.message_id, e.created_at
FROM (SELECT pg_current_snapshot() AS snap,
             pg_current_xact_id_if_assigned()::text::bigint AS own) AS c
LEFT JOIN LATERAL (
    SELECT u.* FROM (
        (SELECT 0 AS part, ev.seq, ev.xid, ev.topic, ev.key, ev.payload, ev.headers,
                ev.message_id, ev.created_at
         FROM hopper_stream_event AS ev
         WHERE ev.xid = %(xid)s
           AND ev.seq > %(seq)s
           AND ev.xid IS DISTINCT FROM c.own
           AND pg_visible_in_snapshot(ev.xid::text::xid8, c.snap)
           AND ev.topic ~ %(regex)s
         ORDER BY ev.seq
         LIMIT %(limit)s)
        UNION ALL
        (SELECT 1 AS part, ev.seq, ev.xid, ev.topic, ev.key, ev.payload, ev.headers,
                ev.message_id, ev.created_at
         FROM hopper_stream_event AS ev
         WHERE ev.xid >= %(xmin)s
           AND ev.xid < pg_snapshot_xmax(c.snap)::text::bigint
           AND ev.xid <> %(xid)s
           AND ev.xid IS DISTINCT FROM c.own
           AND pg_visible_in_snapshot(ev.xid::text::xid8, c.snap)
           AND NOT pg_visible_in_snapshot(ev.xid::text::xid8, %(snapshot)s::pg_snapshot)
           AND ev.topic ~ %(regex)s
         ORDER BY ev.xid, ev.seq
         LIMIT %(limit)s)
    ) AS u
    ORDER BY u.part, u.xid, u.seq
    LIMIT %(limit)s
) AS e ON true
ORDER BY e.part, e.xid, e.seq

-- name: stream_pump.advance
UPDATE hopper_stream_consumer
SET snapshot = %(snapshot)s,
    position_xid = %(xid)s,
    position_seq = %(seq)s,
    delivered_at = CASE WHEN %(delivered)s THEN coalesce(%(now)s::timestamptz, now())
                        ELSE delivered_at END,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s

-- name: stream_prune
-- The oldest events past retention, a chunk at a time (index hopper_stream_created).
DELETE FROM hopper_stream_event
WHERE seq IN (
    SELECT seq FROM hopper_stream_event
    WHERE created_at < coalesce(%(now)s::timestamptz, now()) - %(retention)s
    ORDER BY created_at
    LIMIT %(limit)s
)

-- name: stream_consumer_pause
-- A paused consumer stays paused from its first pause. A pump holding the row
-- finishes first; every later pump reads paused_at under the lock and stops.
UPDATE hopper_stream_consumer
SET paused_at = coalesce(paused_at, coalesce(%(now)s::timestamptz, now())),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at

-- name: stream_consumer_resume
UPDATE hopper_stream_consumer
SET paused_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at

-- name: stream_consumer_delete
DELETE FROM hopper_stream_consumer
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at

-- name: stream_consumer_delete.waiting
-- The consumer's deliveries not running (waiting, scheduled or retrying).
SELECT id FROM hopper_job
WHERE state <> 'running'
  AND metadata ->> 'consumer' = %(name)s
ORDER BY id

-- name: stream_consumer_lag
-- Per consumer, a window of what a pump would read now: its first %(window)s
-- waiting events (committed in the statement's snapshot, not in the stored one,
-- less the part of the position's transaction already delivered), in (xid, seq)
-- order from the stored xmin (index hopper_stream_position, so the scan stops at
-- the window whatever the log's size); how many of them match its pattern, and
-- when the first matching one was appended. The consumers arrive as (name, regex)
-- arrays.
SELECT c.name, w.waiting, w.matched, w.oldest
FROM (SELECT pg_current_snapshot() AS snap) AS s,
     unnest(%(names)s::text[], %(regexes)s::text[]) AS r(name, regex)
JOIN hopper_stream_consumer AS c ON c.name = r.name
CROSS JOIN LATERAL (
    SELECT coalesce(c.snapshot, '1:1:')::pg_snapshot AS stored
) AS k
CROSS JOIN LATERAL (
    SELECT count(*) AS waiting,
           count(*) FILTER (WHERE e.topic ~ r.regex) AS matched,
           min(e.created_at) FILTER (WHERE e.topic ~ r.regex) AS oldest
    FROM (
        SELECT ev.topic, ev.created_at
        FROM hopper_stream_event AS ev
        WHERE ev.xid >= pg_snapshot_xmin(k.stored)::text::bigint
          AND ((ev.xid = c.position_xid AND ev.seq > c.position_seq)
               OR (ev.xid <> c.position_xid
                   AND NOT pg_visible_in_snapshot(ev.xid::text::xid8, k.stored)))
          AND pg_visible_in_snapshot(ev.xid::text::xid8, s.snap)
        ORDER BY ev.xid, ev.seq
        LIMIT %(window)s
    ) AS e
) AS w
ORDER BY c.name
