-- Workflow queries of the SQLite engine. See the PostgreSQL engine's
-- workflows.sql for the model; here every step of an operation is its own
-- statement inside one transaction, which the single writer makes atomic.

-- name: workflow_insert
-- %(rows)s: [id, kind, queue, state, priority, max_attempts, scheduled_at, args,
-- metadata, ordering_key, partition_key, tags, expires_at, awaited, step, subject].
INSERT INTO hopper_job (
    id, kind, queue, state, priority, attempt, max_attempts, scheduled_at, fence,
    args, metadata, errors, ordering_key, partition_key, tags, batch_id, expires_at, awaited,
    created_at, step, subject)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), 0,
       json_extract(value, '$[5]'), json_extract(value, '$[6]'), 0,
       json_extract(value, '$[7]'), json_extract(value, '$[8]'), '[]',
       json_extract(value, '$[9]'), json_extract(value, '$[10]'), json_extract(value, '$[11]'),
       %(batch_id)s, json_extract(value, '$[12]'), json_extract(value, '$[13]'), %(now)s,
       json_extract(value, '$[14]'), json_extract(value, '$[15]')
FROM json_each(%(rows)s);

-- name: workflow_insert.edges
-- %(edges)s: [job_id, depends_on, on_failure, reads (0/1)].
INSERT INTO hopper_job_dependency (workflow_id, job_id, depends_on, on_failure, reads)
SELECT %(batch_id)s, json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json_extract(value, '$[3]')
FROM json_each(%(edges)s);

-- name: workflow_get
SELECT b.id, b.name,
       b.pending - coalesce((SELECT sum(p.done) FROM hopper_batch_progress AS p
                             WHERE p.batch_id = b.id), 0),
       b.failed + coalesce((SELECT sum(p.failed) FROM hopper_batch_progress AS p
                            WHERE p.batch_id = b.id), 0),
       b.total, b.completed_at, b.created_at, b.metadata, b.is_workflow
FROM hopper_batch AS b
WHERE b.id = %(id)s AND b.is_workflow;

-- name: workflow_get.jobs
-- Live and finished jobs in ID order; the step follows output (convert.job_from_row).
SELECT {job_columns}
FROM hopper_job
WHERE batch_id = %(id)s
UNION ALL
SELECT {job_columns_history}
FROM hopper_job_history
WHERE batch_id = %(id)s
ORDER BY id;

-- name: workflow_get.edges
SELECT job_id, depends_on, on_failure, reads
FROM hopper_job_dependency
WHERE workflow_id = %(id)s
ORDER BY id;

-- name: workflow_promote_ready
-- The pending candidates (dependents of %(depends_on)s, a JSON array, or a
-- sweep's chunk after %(after)s) with whether all their dependencies left the
-- live table, and how they fail: 1 cancel, 2 discard, NULL run. The pending
-- jobs are read from index hopper_job_state (INDEXED BY): without it SQLite
-- walks the whole live table in ID order to spare the sort, under the write
-- lock (0.6 s a sweep, every second, with 10^6 jobs waiting); this way the
-- cost follows the pending jobs alone.
SELECT j.id,
       NOT EXISTS (SELECT 1 FROM hopper_job_dependency AS d
                   JOIN hopper_job AS l ON l.id = d.depends_on
                   WHERE d.job_id = j.id) AS ready,
       (SELECT min(CASE d.on_failure WHEN 'cancel' THEN 1 ELSE 2 END)
        FROM hopper_job_dependency AS d
        LEFT JOIN hopper_dependency_result AS r ON r.job_id = d.depends_on
        WHERE d.job_id = j.id AND d.on_failure <> 'run'
          AND coalesce(r.state, 'completed') <> 'completed') AS fail
FROM hopper_job AS j INDEXED BY hopper_job_state
WHERE j.state = 'pending'
  AND CASE WHEN %(depends_on)s IS NOT NULL
           THEN j.id IN (SELECT d.job_id FROM hopper_job_dependency AS d
                         WHERE d.depends_on IN (SELECT value FROM json_each(%(depends_on)s)))
           ELSE j.batch_id IS NOT NULL AND j.id > %(after)s END
ORDER BY j.id
LIMIT %(limit)s;

-- name: workflow_promote_ready.promote
UPDATE hopper_job
SET state = CASE WHEN scheduled_at > %(now)s THEN 'scheduled' ELSE 'available' END
WHERE id IN (SELECT value FROM json_each(%(ids)s)) AND state = 'pending'
RETURNING queue;

-- name: workflow_promote_ready.archive
-- Pending jobs a failed dependency fails: to history as %(fails)s says
-- ([id, state]), with an error entry hopper records itself.
INSERT INTO hopper_job_history ({job_columns_history})
SELECT j.id, j.kind, j.queue, json_extract(f.value, '$[1]'), j.priority, j.attempt,
       j.max_attempts, j.scheduled_at, j.attempted_at, j.attempted_by, j.fence, j.args,
       {history_metadata_j},
       hopper_json_append(j.errors, json_object(
           'at', %(at)s, 'attempt', j.attempt,
           'error', 'a dependency was canceled or discarded', 'rescue', 'dependency_failed')),
       j.unique_key, j.ordering_key, j.partition_key, j.tags, j.batch_id, j.expires_at,
       j.cancel_requested_at, j.awaited, j.created_at, NULL, j.progress, NULL, NULL, NULL,
       j.step, j.subject, j.erased_at, %(now)s, NULL
FROM json_each(%(fails)s) AS f
JOIN hopper_job AS j ON j.id = json_extract(f.value, '$[0]')
WHERE j.state = 'pending';

-- name: workflow_promote_ready.delete
DELETE FROM hopper_job
WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(%(fails)s))
  AND state = 'pending'
RETURNING id, batch_id, step, awaited;

-- name: workflow_promote_ready.progress
-- Record finished jobs' batch progress. %(finished)s: [id, batch_id, step, state,
-- output (JSON text or NULL)].
INSERT INTO hopper_batch_progress (batch_id, done, failed)
SELECT json_extract(value, '$[1]'), count(*),
       sum(json_extract(value, '$[3]') <> 'completed')
FROM json_each(%(finished)s)
GROUP BY json_extract(value, '$[1]');

-- name: workflow_promote_ready.results
-- Their final state for their dependents, and their output for a reading one.
INSERT INTO hopper_dependency_result (job_id, workflow_id, step, state, output, finalized_at)
SELECT json_extract(f.value, '$[0]'), json_extract(f.value, '$[1]'),
       json_extract(f.value, '$[2]'), json_extract(f.value, '$[3]'),
       CASE WHEN EXISTS (SELECT 1 FROM hopper_job_dependency AS d
                         WHERE d.depends_on = json_extract(f.value, '$[0]') AND d.reads)
            THEN json_extract(f.value, '$[4]') END,
       %(now)s
FROM json_each(%(finished)s) AS f
WHERE EXISTS (SELECT 1 FROM hopper_job_dependency AS d
              WHERE d.depends_on = json_extract(f.value, '$[0]'))
ON CONFLICT (job_id) DO UPDATE
SET state = excluded.state, output = excluded.output, finalized_at = excluded.finalized_at;

-- name: job_claim.dependencies
-- The dependencies that claimed workflow jobs (%(ids)s, JSON) read, by dependency ID.
SELECT d.job_id, d.depends_on, coalesce(r.step, ''), coalesce(r.state, ''), r.output
FROM hopper_job_dependency AS d
LEFT JOIN hopper_dependency_result AS r ON r.job_id = d.depends_on
WHERE d.job_id IN (SELECT value FROM json_each(%(ids)s)) AND d.reads
ORDER BY d.job_id, d.depends_on;
