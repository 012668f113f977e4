-- History retention and upkeep on SQLite. History is one table:
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

-- name: history_maintain.orphan_batches
-- One bounded chunk of completed batches that nothing refers to any more: no
-- job of theirs is live or in history, and no callback of theirs (metadata
-- batch_id, text with dashes; IDs are stored as 32 hex digits here) is live,
-- so no get_batch from a callback can miss them.
SELECT b.id
  FROM hopper_batch b
 WHERE b.completed_at IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.batch_id = b.id)
   AND NOT EXISTS (SELECT 1 FROM hopper_job_history h WHERE h.batch_id = b.id)
   AND NOT EXISTS (SELECT 1 FROM hopper_job j
                    WHERE replace(CASE WHEN json_valid(j.metadata)
                                       THEN json_extract(j.metadata, '$.batch_id') END,
                                  '-', '') = b.id)
 ORDER BY b.id
 LIMIT %(limit)s;

-- name: history_maintain.orphan_batches_progress
-- Their leftover progress rows go with them.
DELETE FROM hopper_batch_progress WHERE batch_id IN (SELECT value FROM json_each(%(ids)s));

-- name: history_maintain.orphan_batches_delete
DELETE FROM hopper_batch WHERE id IN (SELECT value FROM json_each(%(ids)s));

-- name: history_maintain.orphan_edges
-- One bounded chunk of workflow edges whose dependent is gone from live and
-- history: nothing promotes or shows it again.
DELETE FROM hopper_job_dependency
 WHERE id IN (
    SELECT x.id
      FROM hopper_job_dependency x
     WHERE NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.id = x.job_id)
       AND NOT EXISTS (SELECT 1 FROM hopper_job_history h WHERE h.id = x.job_id)
     LIMIT %(limit)s);

-- name: history_maintain.orphan_steps
-- One bounded chunk of step-ledger rows whose job is gone from live and
-- history (a discarded or canceled run keeps its ledger as evidence only as
-- long as the run itself is kept).
DELETE FROM hopper_job_step
 WHERE id IN (
    SELECT x.id
      FROM hopper_job_step x
     WHERE NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.id = x.job_id)
       AND NOT EXISTS (SELECT 1 FROM hopper_job_history h WHERE h.id = x.job_id)
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
-- Whether any table was ever analyzed (sqlite_stat1 exists only from the first
-- ANALYZE on).
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_stat1';

-- name: jobs_maintain.estimate
-- The rows a table held at its last ANALYZE, as the planner reads them: the first
-- number of each of its sqlite_stat1 rows is the entries of one index (or the
-- table's rows, idx NULL), so the largest is the table's (every index that is
-- not partial holds every row); -1 if it has none (never analyzed, or empty then).
SELECT coalesce(max(CAST(stat AS INTEGER)), -1) FROM sqlite_stat1 WHERE tbl = %(table)s;

-- name: jobs_maintain.count
-- The rows now: a count over the table's smallest index (tens of ms at 10^6 rows),
-- a read, so in WAL mode it never holds the write lock. {table} is one of
-- rules.HOT_TABLES.
SELECT count(*) FROM {table};

-- name: jobs_maintain.analyze
-- A full ANALYZE of one table (no analysis_limit: a sample misjudges a table
-- whose rows share one queue), under the write lock: about 0.7 s at 10^6 rows.
ANALYZE {table};

-- name: jobs_maintain.empty_indexes
-- After an ANALYZE: give each index of the table that got no sqlite_stat1 row
-- the row of an empty index ("0" and a 0 per column), as newer SQLite versions
-- (3.51) write themselves. Older ones (3.40) write none for an empty (partial) index,
-- so the planner would guess half the table for it (and PRAGMA optimize would
-- take the table for unanalyzed); this way every version plans from the same
-- statistics. sqlite_stat1 is writable by applications (SQLite documents it).
INSERT INTO sqlite_stat1 (tbl, idx, stat)
SELECT m.tbl_name, m.name,
       '0' || (SELECT group_concat(' 0', '') FROM pragma_index_info(m.name))
  FROM sqlite_master AS m
 WHERE m.type = 'index' AND m.tbl_name = %(table)s
   AND m.name NOT IN (SELECT idx FROM sqlite_stat1 WHERE tbl = %(table)s AND idx IS NOT NULL);

-- name: jobs_maintain.reload
-- Make the planner read the statistics just written.
ANALYZE sqlite_master;

-- name: jobs_maintain.busy_timeout
PRAGMA busy_timeout;

-- name: jobs_maintain.busy_timeout_set
PRAGMA busy_timeout = {ms};
