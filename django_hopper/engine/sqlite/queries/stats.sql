-- Stats of the SQLite engine.

-- name: stats
-- Per queue: depths by state, the oldest claimable job's schedule, completions in
-- the last minute and the pause; queues known from their row, live jobs or history.
WITH live AS (
    SELECT queue,
           sum(state = 'available') AS available,
           sum(state = 'scheduled') AS scheduled,
           sum(state = 'retryable') AS retryable,
           sum(state = 'running') AS running,
           min(CASE WHEN state IN ('available', 'scheduled', 'retryable')
                         AND scheduled_at <= %(now)s
                         AND (expires_at IS NULL OR expires_at > %(now)s)
                    THEN scheduled_at END) AS oldest
    FROM hopper_job
    GROUP BY queue),
done AS (
    SELECT queue, count(*) AS completed
    FROM hopper_job_history
    WHERE finalized_at > %(minute_ago)s AND finalized_at <= %(now)s AND state = 'completed'
    GROUP BY queue),
reported AS (
    -- Completions not archived: each live client reports its own last minute.
    SELECT e.key AS queue, sum(e.value) AS completed
    FROM hopper_client cl, json_each(cl.completed) e
    WHERE cl.expires_at > %(now)s AND json_valid(cl.completed)
      AND json_type(cl.completed) = 'object' AND e.type = 'integer'
    GROUP BY e.key),
names AS (
    SELECT name AS queue FROM hopper_queue
    UNION SELECT queue FROM live
    UNION SELECT queue FROM done
    UNION SELECT queue FROM reported)
SELECT n.queue, coalesce(l.available, 0), coalesce(l.scheduled, 0), coalesce(l.retryable, 0),
       coalesce(l.running, 0), l.oldest, coalesce(d.completed, 0) + coalesce(r.completed, 0),
       coalesce(q.paused_at IS NOT NULL, 0)
FROM names n
LEFT JOIN live l ON l.queue = n.queue
LEFT JOIN done d ON d.queue = n.queue
LEFT JOIN reported r ON r.queue = n.queue
LEFT JOIN hopper_queue q ON q.name = n.queue
ORDER BY n.queue;

-- name: stats.clients
SELECT (SELECT count(*) FROM hopper_client WHERE expires_at > %(now)s),
       (SELECT client_id FROM hopper_leader WHERE name = 'default' AND expires_at > %(now)s);

-- name: stats.running
SELECT attempted_by, count(*)
FROM hopper_job
WHERE state = 'running' AND attempted_by IS NOT NULL
GROUP BY attempted_by;
