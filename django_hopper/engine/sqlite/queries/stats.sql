-- Stats of the SQLite engine.

-- fragment: stats_by_queue
-- The per-queue result both stats queries end with: completions in the last
-- minute (history by finalized_at, plus what live clients report of the jobs
-- they completed without archiving), the queue names and the final select.
-- The query before it defines live(queue, available, scheduled, retryable,
-- running) and oldest(queue, at).
done AS (
    -- The last minute by the finalized_at index (+state: never the state index,
    -- which would read every completed job).
    SELECT queue, count(*) AS completed
    FROM hopper_job_history
    WHERE finalized_at > %(minute_ago)s AND finalized_at <= %(now)s AND +state = 'completed'
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
       coalesce(l.running, 0), o.at, coalesce(d.completed, 0) + coalesce(r.completed, 0),
       coalesce(q.paused_at IS NOT NULL, 0)
FROM names n
LEFT JOIN live l ON l.queue = n.queue
LEFT JOIN oldest o ON o.queue = n.queue
LEFT JOIN done d ON d.queue = n.queue
LEFT JOIN reported r ON r.queue = n.queue
LEFT JOIN hopper_queue q ON q.name = n.queue
ORDER BY n.queue

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
oldest AS (
    SELECT queue, oldest AS at FROM live),
{stats_by_queue};

-- name: stats.clients
SELECT (SELECT count(*) FROM hopper_client WHERE expires_at > %(now)s),
       (SELECT client_id FROM hopper_leader WHERE name = 'default' AND expires_at > %(now)s);

-- name: stats.running
SELECT attempted_by, count(*)
FROM hopper_job
WHERE state = 'running' AND attempted_by IS NOT NULL
GROUP BY attempted_by;

-- name: stats_bounded
-- Per queue, what stats reads, at a cost that does not grow with the live jobs:
-- each (queue, state) count stops at %(window)s index entries of hopper_job_state,
-- and the queues with live jobs are found by a skip scan of that index (one
-- probe per pair). The oldest waiting job is the first entry of an index: of
-- hopper_job_claim per priority present (a skip scan of the queue's
-- priorities), of hopper_job_keyed likewise, and of hopper_job_due.
WITH RECURSIVE states(state) AS (
    VALUES ('pending'), ('available'), ('scheduled'), ('retryable'), ('running')),
pairs(state, queue) AS (
    SELECT s.state,
           (SELECT j.queue FROM hopper_job j WHERE j.state = s.state
            ORDER BY j.queue LIMIT 1)
    FROM states s
    UNION ALL
    SELECT p.state,
           (SELECT j.queue FROM hopper_job j WHERE j.state = p.state AND j.queue > p.queue
            ORDER BY j.queue LIMIT 1)
    FROM pairs p
    WHERE p.queue IS NOT NULL),
counted AS (
    SELECT p.state, p.queue,
           (SELECT count(*) FROM (SELECT 1 FROM hopper_job j
                                  WHERE j.state = p.state AND j.queue = p.queue
                                  LIMIT %(window)s)) AS n
    FROM pairs p
    WHERE p.queue IS NOT NULL),
waiting AS (
    SELECT DISTINCT queue FROM counted WHERE state IN ('available', 'scheduled', 'retryable')),
plain(queue, priority) AS (
    SELECT w.queue,
           (SELECT j.priority FROM hopper_job j
            WHERE j.state = 'available' AND j.ordering_key IS NULL AND j.queue = w.queue
            ORDER BY j.priority DESC LIMIT 1)
    FROM waiting w
    UNION ALL
    SELECT p.queue,
           (SELECT j.priority FROM hopper_job j
            WHERE j.state = 'available' AND j.ordering_key IS NULL AND j.queue = p.queue
              AND j.priority < p.priority
            ORDER BY j.priority DESC LIMIT 1)
    FROM plain p
    WHERE p.priority IS NOT NULL),
keyed(queue, priority) AS (
    SELECT w.queue,
           (SELECT j.priority FROM hopper_job j
            WHERE j.ordering_key IS NOT NULL AND j.state IN ('available', 'scheduled', 'retryable')
              AND j.queue = w.queue
            ORDER BY j.priority DESC LIMIT 1)
    FROM waiting w
    UNION ALL
    SELECT k.queue,
           (SELECT j.priority FROM hopper_job j
            WHERE j.ordering_key IS NOT NULL AND j.state IN ('available', 'scheduled', 'retryable')
              AND j.queue = k.queue AND j.priority < k.priority
            ORDER BY j.priority DESC LIMIT 1)
    FROM keyed k
    WHERE k.priority IS NOT NULL),
firsts(queue, at) AS (
    SELECT p.queue,
           (SELECT j.scheduled_at FROM hopper_job j
            WHERE j.state = 'available' AND j.ordering_key IS NULL AND j.queue = p.queue
              AND j.priority = p.priority AND j.scheduled_at <= %(now)s
              AND (j.expires_at IS NULL OR j.expires_at > %(now)s)
            ORDER BY j.scheduled_at LIMIT 1)
    FROM plain p
    WHERE p.priority IS NOT NULL
    UNION ALL
    SELECT k.queue,
           (SELECT j.scheduled_at FROM hopper_job j
            WHERE j.ordering_key IS NOT NULL AND j.state IN ('available', 'scheduled', 'retryable')
              AND j.queue = k.queue AND j.priority = k.priority AND j.scheduled_at <= %(now)s
              AND (j.expires_at IS NULL OR j.expires_at > %(now)s)
            ORDER BY j.scheduled_at LIMIT 1)
    FROM keyed k
    WHERE k.priority IS NOT NULL
    UNION ALL
    SELECT w.queue,
           (SELECT j.scheduled_at FROM hopper_job j
            WHERE j.state IN ('scheduled', 'retryable') AND j.queue = w.queue
              AND j.scheduled_at <= %(now)s AND (j.expires_at IS NULL OR j.expires_at > %(now)s)
            ORDER BY j.scheduled_at LIMIT 1)
    FROM waiting w),
oldest AS (
    SELECT queue, min(at) AS at FROM firsts GROUP BY queue),
live AS (
    SELECT queue,
           sum(CASE WHEN state = 'available' THEN n ELSE 0 END) AS available,
           sum(CASE WHEN state = 'scheduled' THEN n ELSE 0 END) AS scheduled,
           sum(CASE WHEN state = 'retryable' THEN n ELSE 0 END) AS retryable,
           sum(CASE WHEN state = 'running' THEN n ELSE 0 END) AS running
    FROM counted
    GROUP BY queue),
{stats_by_queue};
