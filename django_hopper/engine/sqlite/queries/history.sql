-- History retention and upkeep on SQLite (issue 6). History is one table:
-- retention deletes in bounded chunks, each its own short write transaction.

-- name: history_maintain
-- One chunk of jobs past their own retention, oldest first.
SELECT id FROM hopper_job_history
 WHERE (state = 'completed' AND finalized_at < %(completed_before)s)
    OR (state IN ('canceled', 'discarded') AND finalized_at < %(failed_before)s)
 ORDER BY finalized_at
 LIMIT %(limit)s;

-- name: history_maintain.delete_logs
DELETE FROM hopper_job_log WHERE job_id IN (SELECT value FROM json_each(%(ids)s));

-- name: history_maintain.delete
DELETE FROM hopper_job_history WHERE id IN (SELECT value FROM json_each(%(ids)s));

-- name: history_maintain.count_expired
SELECT count(*) FROM (
    SELECT 1 FROM hopper_job_history
     WHERE (state = 'completed' AND finalized_at < %(completed_before)s)
        OR (state IN ('canceled', 'discarded') AND finalized_at < %(failed_before)s)
     LIMIT %(limit)s);

-- name: history_partitions
-- History is one table here: how many rows it holds, for hopper_partitions.
SELECT count(*) FROM hopper_job_history;

-- name: history_index
-- The indexes of the single history table, which migrations build directly;
-- there is nothing to build per partition.
SELECT name FROM sqlite_master
 WHERE type = 'index' AND tbl_name = 'hopper_job_history' AND sql IS NOT NULL
 ORDER BY name;

-- name: jobs_maintain
-- Refresh planner statistics where SQLite judges them stale; never waits
-- long for the write lock (busy timeout lowered around it).
PRAGMA optimize;

-- name: jobs_maintain.busy_timeout
PRAGMA busy_timeout;

-- name: jobs_maintain.busy_timeout_set
PRAGMA busy_timeout = {ms};
