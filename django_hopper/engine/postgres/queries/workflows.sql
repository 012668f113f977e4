-- Workflow queries of the PostgreSQL engine.
--
-- A workflow is a batch (hopper_batch.is_workflow) whose jobs carry its ID as
-- batch_id, a step name, and edges in hopper_job_dependency. A finalized job
-- with dependents leaves a hopper_dependency_result row (its final state, and
-- its output when a dependent reads it), written by the statement that moves it
-- out of the live table; promotion reads dependency states from there.

-- name: workflow_insert
-- The batch, the jobs and the edges in one statement. Jobs with dependencies
-- start pending; the others available or scheduled as any insert.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
batch AS (
    INSERT INTO hopper_batch (id, name, is_workflow, total, pending, failed, completed_at,
                              created_at, metadata, on_success, on_failure, on_complete)
    SELECT %(batch_id)s::uuid, %(name)s, true, %(total)s, %(total)s, 0, NULL, c.now,
           %(batch_metadata)s::jsonb, %(on_success)s::jsonb, %(on_failure)s::jsonb,
           %(on_complete)s::jsonb
    FROM clock c
),
input AS (
    SELECT t.*, coalesce(t.sched, c.now) AS scheduled_at, c.now
    FROM unnest(%(id)s::uuid[], %(kind)s::text[], %(queue)s::text[], %(priority)s::int2[],
                %(max_attempts)s::int4[], %(scheduled_at)s::timestamptz[], %(args)s::text[],
                %(metadata)s::text[], %(tags)s::text[], %(ordering_key)s::text[],
                %(partition_key)s::text[], %(ttl)s::interval[], %(awaited)s::bool[],
                %(step)s::text[], %(pending)s::bool[], %(subject)s::text[])
         WITH ORDINALITY AS t(id, kind, queue, priority, max_attempts, sched, args, metadata,
                              tags, ordering_key, partition_key, ttl, awaited, step, pending,
                              subject, ord)
    CROSS JOIN clock c
),
jobs AS (
    INSERT INTO hopper_job AS j (id, kind, queue, state, priority, attempt, max_attempts,
                                 scheduled_at, fence, args, metadata, errors, ordering_key,
                                 partition_key, tags, batch_id, expires_at, awaited,
                                 created_at, step, subject)
    SELECT i.id, i.kind, i.queue,
           CASE WHEN i.pending THEN 'pending'
                WHEN i.scheduled_at > i.now THEN 'scheduled' ELSE 'available' END,
           i.priority, 0, i.max_attempts, i.scheduled_at, 0, i.args::jsonb, i.metadata::jsonb,
           '[]'::jsonb, i.ordering_key, i.partition_key, i.tags::jsonb, %(batch_id)s::uuid,
           i.now + i.ttl, i.awaited, i.now, i.step, i.subject
    FROM input i
    ORDER BY i.ord
    RETURNING j.id, j.state, j.scheduled_at, j.expires_at, j.created_at
),
edges AS (
    INSERT INTO hopper_job_dependency (workflow_id, job_id, depends_on, on_failure, reads)
    SELECT %(batch_id)s::uuid, e.job_id, e.depends_on, e.on_failure, e.reads
    FROM unnest(%(edge_job)s::uuid[], %(edge_depends_on)s::uuid[], %(edge_on_failure)s::text[],
                %(edge_reads)s::bool[]) AS e(job_id, depends_on, on_failure, reads)
)
SELECT * FROM jobs

-- name: workflow_get
SELECT b.id, b.name, b.pending - coalesce(p.done, 0), b.failed + coalesce(p.failed, 0),
       b.total, b.completed_at, b.created_at, b.metadata, b.is_workflow
FROM hopper_batch b
LEFT JOIN LATERAL (SELECT sum(x.done) AS done, sum(x.failed) AS failed
                   FROM hopper_batch_progress x WHERE x.batch_id = b.id) p ON true
WHERE b.id = %(id)s::uuid AND b.is_workflow

-- name: workflow_get.jobs
-- Live and finished jobs of the workflow, in insertion (ID) order.
SELECT * FROM (
    SELECT {job_columns:j}
    FROM hopper_job j WHERE j.batch_id = %(id)s::uuid
    UNION ALL
    SELECT {job_columns_history:h}
    FROM hopper_job_history h WHERE h.batch_id = %(id)s::uuid
) u
ORDER BY u.id

-- name: workflow_get.edges
SELECT d.job_id, d.depends_on, d.on_failure, d.reads
FROM hopper_job_dependency d
WHERE d.workflow_id = %(id)s::uuid
ORDER BY d.id

-- name: workflow_promote_ready
-- One statement: the pending candidates (dependents of %(depends_on)s, or a
-- sweep's chunk) whose dependencies have all left the live table either become
-- claimable, or, when a dependency ended canceled or discarded on an edge
-- whose on_failure is cancel or discard, move to history as canceled (cancel
-- wins) or discarded, recording their batch progress and dependency results
-- as a finalize does. Returns counts, the sweep's last ID, and the jobs that
-- failed (whose own dependents the engine considers next).
-- The candidates' lock waits: for named jobs, two dependencies finalized at
-- once by two transactions must not each skip the join the other one holds,
-- or it stays pending until the sweep. workflows.py bounds that wait
-- (batch_settle.lock_timeout) and, past it, runs this statement with SKIP
-- LOCKED, as the sweep always does.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
cand AS (
    SELECT j.id
    FROM hopper_job j
    WHERE j.state = 'pending'
      AND CASE WHEN %(depends_on)s::uuid[] IS NOT NULL
               THEN j.id IN (SELECT d.job_id FROM hopper_job_dependency d
                             WHERE d.depends_on = ANY (%(depends_on)s::uuid[]))
               ELSE j.batch_id IS NOT NULL
                    AND (%(after)s::uuid IS NULL OR j.id > %(after)s::uuid) END
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j
),
ready AS (
    SELECT c.id,
           (SELECT min(CASE d.on_failure WHEN 'cancel' THEN 1 ELSE 2 END)
            FROM hopper_job_dependency d
            LEFT JOIN hopper_dependency_result r ON r.job_id = d.depends_on
            WHERE d.job_id = c.id AND d.on_failure <> 'run'
              AND coalesce(r.state, 'completed') <> 'completed') AS fail
    FROM cand c
    WHERE NOT EXISTS (SELECT 1 FROM hopper_job_dependency d
                      JOIN hopper_job l ON l.id = d.depends_on
                      WHERE d.job_id = c.id)
),
promoted AS (
    UPDATE hopper_job j
    SET state = CASE WHEN j.scheduled_at > c.now THEN 'scheduled' ELSE 'available' END
    FROM ready r CROSS JOIN clock c
    WHERE j.id = r.id AND r.fail IS NULL
    RETURNING j.id, j.queue
),
gone AS (
    DELETE FROM hopper_job j
    USING ready r
    WHERE j.id = r.id AND r.fail IS NOT NULL
    RETURNING j.*, CASE r.fail WHEN 1 THEN 'canceled' ELSE 'discarded' END AS new_state
),
archived AS (
    INSERT INTO hopper_job_history ({job_columns_history})
    SELECT g.id, g.kind, g.queue, g.new_state, g.priority, g.attempt, g.max_attempts,
           g.scheduled_at, g.attempted_at, g.attempted_by, g.fence, g.args,
           {history_metadata_g},
           g.errors || jsonb_build_array(jsonb_build_object(
               'at', c.now, 'attempt', g.attempt, 'error', 'a dependency was canceled or discarded',
               'rescue', 'dependency_failed')),
           g.unique_key, g.ordering_key, g.partition_key, g.tags, g.batch_id, g.expires_at,
           g.cancel_requested_at, g.awaited, g.created_at, NULL, g.progress, NULL, NULL, NULL,
           g.step, g.subject, g.erased_at, c.now, NULL
    FROM gone g CROSS JOIN clock c
),
{gone_failed_progress},
results AS (
    INSERT INTO hopper_dependency_result (job_id, workflow_id, step, state, output, finalized_at)
    SELECT g.id, g.batch_id, g.step, g.new_state, NULL, c.now
    FROM gone g CROSS JOIN clock c
    WHERE g.batch_id IS NOT NULL
      AND EXISTS (SELECT 1 FROM hopper_job_dependency d WHERE d.depends_on = g.id)
    ON CONFLICT (job_id) DO UPDATE
    SET state = EXCLUDED.state, output = EXCLUDED.output, finalized_at = EXCLUDED.finalized_at
),
woken AS (
    SELECT count(pg_notify(%(insert_channel)s, q.queue)) AS n
    FROM (SELECT DISTINCT p.queue FROM promoted p) q
),
done AS (
    SELECT count(pg_notify(%(done_channel)s, g.id::text)) AS n FROM gone g WHERE g.awaited
)
SELECT (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM cand),
       (SELECT c.id FROM cand c ORDER BY c.id DESC LIMIT 1),
       (SELECT coalesce(array_agg(g.id), '{}'::uuid[]) FROM gone g),
       (SELECT coalesce(array_agg(DISTINCT g.batch_id), '{}'::uuid[]) FROM gone g
        WHERE g.batch_id IS NOT NULL),
       woken.n + done.n
FROM woken CROSS JOIN done

-- name: workflow_promote_ready.record
-- Jobs a statement other than a finalize took out of the live table (a cancel,
-- a delete, an expiry): record their batch progress and dependency results as
-- the finalize does. %(state)s is each job's final state.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
f AS (
    SELECT * FROM unnest(%(id)s::uuid[], %(batch_id)s::uuid[], %(step)s::text[],
                         %(state)s::text[]) AS t(id, batch_id, step, state)
),
progress AS (
    INSERT INTO hopper_batch_progress (batch_id, done, failed)
    SELECT f.batch_id, count(*), count(*) FILTER (WHERE f.state <> 'completed')
    FROM f GROUP BY f.batch_id
)
INSERT INTO hopper_dependency_result (job_id, workflow_id, step, state, output, finalized_at)
SELECT f.id, f.batch_id, f.step, f.state, NULL, c.now
FROM f CROSS JOIN clock c
WHERE EXISTS (SELECT 1 FROM hopper_job_dependency d WHERE d.depends_on = f.id)
ON CONFLICT (job_id) DO UPDATE
SET state = EXCLUDED.state, output = EXCLUDED.output, finalized_at = EXCLUDED.finalized_at

-- name: job_claim.dependencies
-- The dependencies that claimed workflow jobs read, in the order of their IDs.
SELECT d.job_id, d.depends_on, coalesce(r.step, ''), coalesce(r.state, ''), r.output
FROM hopper_job_dependency d
LEFT JOIN hopper_dependency_result r ON r.job_id = d.depends_on
WHERE d.job_id = ANY (%(ids)s::uuid[]) AND d.reads
ORDER BY d.job_id, d.depends_on
