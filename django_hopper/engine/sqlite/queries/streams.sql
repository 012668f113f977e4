-- Stream queries of the SQLite engine: the event log and its consumers.
--
-- One writer at a time: an event's seq is taken under the write lock, so seq
-- order is commit order and a consumer's position is simply the last seq it
-- read (xid is always 0). A pump begins with a write to the consumer's row,
-- which takes the write lock before anything is read, so two pumps serialize.

-- name: stream_append
INSERT INTO hopper_stream_event (xid, topic, key, payload, headers, message_id, created_at)
VALUES (0, %(topic)s, %(key)s, %(payload)s, %(headers)s, %(message_id)s, %(now)s)
RETURNING seq;

-- name: stream_read
SELECT seq, xid, topic, key, payload, headers, message_id, created_at
FROM hopper_stream_event
WHERE (xid, seq) > (%(xid)s, %(seq)s)
  AND hopper_topic_matches(%(pattern)s, topic)
ORDER BY xid, seq
LIMIT %(limit)s;

-- name: stream_consumer_upsert
-- One row per execution; a new consumer starts before every event (earliest)
-- or at the last one appended (latest).
INSERT INTO hopper_stream_consumer
    (name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
     position_seq, delivered_at, created_at, updated_at)
VALUES (%(name)s, %(pattern)s, %(kind)s, %(queue)s, %(max_attempts)s, %(metadata)s, %(start)s,
        NULL, 0,
        CASE WHEN %(start)s = 'earliest' THEN 0
             ELSE (SELECT coalesce(max(seq), 0) FROM hopper_stream_event) END,
        NULL, %(now)s, %(now)s)
ON CONFLICT (name) DO UPDATE
SET pattern = excluded.pattern,
    kind = excluded.kind,
    queue = excluded.queue,
    max_attempts = excluded.max_attempts,
    metadata = excluded.metadata,
    updated_at = excluded.updated_at;

-- name: stream_consumer_list
SELECT name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
       position_seq, delivered_at, created_at, updated_at, paused_at
FROM hopper_stream_consumer
ORDER BY name;

-- name: stream_consumer_seek
-- %(mode)s is earliest, latest, position or time; a time after every event
-- seeks to the latest.
UPDATE hopper_stream_consumer
SET position_xid = 0,
    position_seq = CASE %(mode)s
        WHEN 'earliest' THEN 0
        WHEN 'position' THEN %(seq)s
        WHEN 'time' THEN coalesce(
            (SELECT min(seq) - 1 FROM hopper_stream_event WHERE created_at >= %(time)s),
            (SELECT coalesce(max(seq), 0) FROM hopper_stream_event))
        ELSE (SELECT coalesce(max(seq), 0) FROM hopper_stream_event)
    END,
    updated_at = %(now)s
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at;

-- name: stream_pump
-- Take the write lock with the consumer's row before reading anything.
UPDATE hopper_stream_consumer
SET updated_at = updated_at
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at;

-- name: stream_pump.events
SELECT seq, xid, topic, key, payload, headers, message_id, created_at
FROM hopper_stream_event
WHERE seq > %(seq)s
  AND hopper_topic_matches(%(pattern)s, topic)
ORDER BY seq
LIMIT %(limit)s;

-- name: stream_pump.last
-- The last event appended: a pump that read every match moves past the rest.
SELECT coalesce(max(seq), 0) FROM hopper_stream_event;

-- name: stream_pump.advance
UPDATE hopper_stream_consumer
SET position_seq = %(seq)s,
    delivered_at = CASE WHEN %(delivered)s THEN %(now)s ELSE delivered_at END,
    updated_at = %(now)s
WHERE name = %(name)s;

-- name: stream_prune
DELETE FROM hopper_stream_event
WHERE seq IN (
    SELECT seq FROM hopper_stream_event
    WHERE created_at < %(cutoff)s
    ORDER BY created_at
    LIMIT %(limit)s
);

-- name: stream_consumer_pause
-- A paused consumer stays paused from its first pause; a pump reads paused_at
-- under the write lock and stops.
UPDATE hopper_stream_consumer
SET paused_at = coalesce(paused_at, %(now)s),
    updated_at = %(now)s
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at;

-- name: stream_consumer_resume
UPDATE hopper_stream_consumer
SET paused_at = NULL,
    updated_at = %(now)s
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at;

-- name: stream_consumer_delete
DELETE FROM hopper_stream_consumer
WHERE name = %(name)s
RETURNING name, pattern, kind, queue, max_attempts, metadata, start, snapshot, position_xid,
          position_seq, delivered_at, created_at, updated_at, paused_at;

-- name: stream_consumer_delete.waiting
-- The consumer's deliveries not running (waiting, scheduled or retrying).
SELECT id FROM hopper_job
WHERE state <> 'running'
  AND CASE WHEN json_valid(metadata) AND json_type(metadata) = 'object'
           THEN json_extract(metadata, '$.consumer') END = %(name)s
ORDER BY id;

-- name: stream_consumer_lag
-- Per consumer (names as a JSON array), a window of its first %(window)s events
-- after its seq (by the primary key: the scan stops at the window whatever the
-- log's size), as [waiting, matching its pattern, first matching one's time].
SELECT c.name,
       (SELECT json_array(count(*), coalesce(sum(w.m), 0), min(CASE WHEN w.m THEN w.created_at END))
        FROM (SELECT e.created_at, hopper_topic_matches(c.pattern, e.topic) AS m
              FROM hopper_stream_event AS e
              WHERE e.seq > c.position_seq
              ORDER BY e.seq
              LIMIT %(window)s) AS w)
FROM hopper_stream_consumer AS c
WHERE c.name IN (SELECT value FROM json_each(%(names)s))
ORDER BY c.name;
