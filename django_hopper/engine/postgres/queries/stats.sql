-- Stats of the PostgreSQL engine.

-- fragment: stats_by_queue
-- The per-queue result both stats queries end with: completions in the last
-- minute (history by finalized_at, plus what live clients report of the jobs
-- they completed without archiving), the queue names and the final select.
-- The query before it defines clock, live(queue, available, scheduled,
-- retryable, running) and oldest(queue, at).
done AS (
    SELECT h.queue, count(*) AS completed
    FROM hopper_job_history h, clock c
    WHERE h.finalized_at > c.now - interval '1 minute' AND h.finalized_at <= c.now
      AND h.state = 'completed'
    GROUP BY h.queue
),
reported AS (
    -- Completions not archived: each live client reports its own last minute.
    SELECT e.key AS queue, sum(e.value::bigint) AS completed
    FROM hopper_client cl
    CROSS JOIN clock c
    CROSS JOIN LATERAL jsonb_each_text(cl.completed) e
    WHERE cl.expires_at > c.now AND jsonb_typeof(cl.completed) = 'object'
      AND e.value ~ '^[0-9]+$'
    GROUP BY e.key
),
names AS (
    SELECT name AS queue FROM hopper_queue
    UNION SELECT queue FROM live
    UNION SELECT queue FROM done
    UNION SELECT queue FROM reported
)
SELECT n.queue,
       coalesce(l.available, 0), coalesce(l.scheduled, 0), coalesce(l.retryable, 0),
       coalesce(l.running, 0),
       CASE WHEN o.at IS NULL THEN interval '0' ELSE greatest(c.now - o.at, interval '0') END,
       coalesce(d.completed, 0) + coalesce(r.completed, 0),
       coalesce(q.paused_at IS NOT NULL, false)
FROM names n
CROSS JOIN clock c
LEFT JOIN live l ON l.queue = n.queue
LEFT JOIN oldest o ON o.queue = n.queue
LEFT JOIN done d ON d.queue = n.queue
LEFT JOIN reported r ON r.queue = n.queue
LEFT JOIN hopper_queue q ON q.name = n.queue
ORDER BY n.queue

-- name: stats
-- Per queue: depths by state, the oldest claimable job's age, completions in
-- the last minute (history by finalized_at, plus what live clients report of
-- the jobs they completed without archiving) and the pause. Queues known from
-- their row, their live jobs or their recent completions.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
live AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'available') AS available,
           count(*) FILTER (WHERE j.state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE j.state = 'retryable') AS retryable,
           count(*) FILTER (WHERE j.state = 'running') AS running,
           min(j.scheduled_at) FILTER (
               WHERE j.state IN ('available', 'scheduled', 'retryable')
                 AND j.scheduled_at <= c.now
                 AND (j.expires_at IS NULL OR j.expires_at > c.now)) AS oldest
    FROM hopper_job j, clock c
    GROUP BY j.queue
),
oldest AS (
    SELECT queue, oldest AS at FROM live
),
{stats_by_queue}

-- name: stats.cluster
-- Live clients, the unexpired leader and running jobs per client.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT (SELECT count(*) FROM hopper_client cl, clock c WHERE cl.expires_at > c.now),
       (SELECT l.client_id FROM hopper_leader l, clock c
        WHERE l.name = 'default' AND l.expires_at > c.now),
       coalesce((SELECT jsonb_object_agg(r.attempted_by::text, r.n)
                 FROM (SELECT attempted_by, count(*) AS n FROM hopper_job
                       WHERE state = 'running' AND attempted_by IS NOT NULL
                       GROUP BY attempted_by) r), '{}'::jsonb)

-- name: stats_bounded
-- Per queue, what stats reads, at a cost that does not grow with the live jobs:
-- each (queue, state) count stops at %(window)s index entries of hopper_job_state,
-- and the queues with live jobs are found by a skip scan of that index (one
-- probe per pair). The oldest waiting job is the first entry of an index: of
-- hopper_job_claim per priority present (a skip scan of the queue's
-- priorities), of hopper_job_keyed likewise, and of hopper_job_due.
WITH RECURSIVE clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
states(state) AS (
    VALUES ('pending'), ('available'), ('scheduled'), ('retryable'), ('running')
),
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
    WHERE p.queue IS NOT NULL
),
counted AS (
    SELECT p.state, p.queue,
           (SELECT count(*) FROM (SELECT 1 FROM hopper_job j
                                  WHERE j.state = p.state AND j.queue = p.queue
                                  LIMIT %(window)s) w) AS n
    FROM pairs p
    WHERE p.queue IS NOT NULL
),
waiting AS (
    SELECT DISTINCT queue FROM counted WHERE state IN ('available', 'scheduled', 'retryable')
),
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
    WHERE p.priority IS NOT NULL
),
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
    WHERE k.priority IS NOT NULL
),
firsts(queue, at) AS (
    SELECT p.queue,
           (SELECT j.scheduled_at FROM hopper_job j
            WHERE j.state = 'available' AND j.ordering_key IS NULL AND j.queue = p.queue
              AND j.priority = p.priority AND j.scheduled_at <= c.now
              AND (j.expires_at IS NULL OR j.expires_at > c.now)
            ORDER BY j.scheduled_at LIMIT 1)
    FROM plain p CROSS JOIN clock c
    WHERE p.priority IS NOT NULL
    UNION ALL
    SELECT k.queue,
           (SELECT j.scheduled_at FROM hopper_job j
            WHERE j.ordering_key IS NOT NULL AND j.state IN ('available', 'scheduled', 'retryable')
              AND j.queue = k.queue AND j.priority = k.priority AND j.scheduled_at <= c.now
              AND (j.expires_at IS NULL OR j.expires_at > c.now)
            ORDER BY j.scheduled_at LIMIT 1)
    FROM keyed k CROSS JOIN clock c
    WHERE k.priority IS NOT NULL
    UNION ALL
    SELECT w.queue,
           (SELECT j.scheduled_at FROM hopper_job j
            WHERE j.state IN ('scheduled', 'retryable') AND j.queue = w.queue
              AND j.scheduled_at <= c.now AND (j.expires_at IS NULL OR j.expires_at > c.now)
            ORDER BY j.scheduled_at LIMIT 1)
    FROM waiting w CROSS JOIN clock c
),
oldest AS (
    SELECT queue, min(at) AS at FROM firsts GROUP BY queue
),
live AS (
    SELECT queue,
           coalesce(sum(n) FILTER (WHERE state = 'available'), 0) AS available,
           coalesce(sum(n) FILTER (WHERE state = 'scheduled'), 0) AS scheduled,
           coalesce(sum(n) FILTER (WHERE state = 'retryable'), 0) AS retryable,
           coalesce(sum(n) FILTER (WHERE state = 'running'), 0) AS running
    FROM counted
    GROUP BY queue
),
{stats_by_queue}
