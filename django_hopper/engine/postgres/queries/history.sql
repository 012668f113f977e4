-- History retention and partitions, history indexes, live-table upkeep.
--
-- History is range-partitioned by finalized_at into days named
-- hopper_job_history_pYYYYMMDD (UTC), with a DEFAULT partition for rows no day
-- partition covers. DDL takes identifiers, which cannot be bound: the
-- `*_sql` queries build the statement server side with format(%I, %L), and
-- the engine runs the text they return.

-- name: history_maintain
-- Each unit of work (a creation, a drop) runs in its own transaction with a
-- lock timeout local to it: what cannot lock in time is deferred.
SELECT set_config('lock_timeout', %(value)s, true);

-- name: history_maintain.default_has_rows
SELECT EXISTS (
    SELECT 1 FROM hopper_job_history_default
     WHERE finalized_at >= %(lower)s AND finalized_at < %(upper)s);

-- name: history_maintain.create_sql
SELECT format('CREATE TABLE %%I PARTITION OF hopper_job_history FOR VALUES FROM (%%L) TO (%%L)',
              %(name)s::text, %(lower)s::timestamptz, %(upper)s::timestamptz);

-- name: history_maintain.count_survivors
-- Rows of a day still within their own retention (up to limit): they would
-- move to DEFAULT if the day were dropped now.
SELECT count(*) FROM (
    SELECT 1 FROM hopper_job_history
     WHERE finalized_at >= %(lower)s AND finalized_at < %(upper)s
       AND ((state = 'completed' AND finalized_at >= %(completed_before)s)
         OR (state <> 'completed' AND finalized_at >= %(failed_before)s))
     LIMIT %(limit)s) AS s;

-- name: history_maintain.delete_logs
-- Attempt logs of the day's jobs that the drop removes; row locks only, run
-- before the drop's unit so that its exclusive lock stays short.
DELETE FROM hopper_job_log l
 USING hopper_job_history h
 WHERE h.finalized_at >= %(lower)s AND h.finalized_at < %(upper)s
   AND l.job_id = h.id
   AND NOT ((h.state = 'completed' AND h.finalized_at >= %(completed_before)s)
         OR (h.state <> 'completed' AND h.finalized_at >= %(failed_before)s));

-- name: history_maintain.detach_sql
SELECT format('ALTER TABLE hopper_job_history DETACH PARTITION %%I', %(name)s::text);

-- name: history_maintain.move_survivors_sql
-- Once detached, no partition covers the day, so the rows land in DEFAULT.
SELECT format('INSERT INTO hopper_job_history SELECT * FROM %%I '
              'WHERE (state = ''completed'' AND finalized_at >= %%L) '
              'OR (state <> ''completed'' AND finalized_at >= %%L)',
              %(name)s::text, %(completed_before)s::timestamptz, %(failed_before)s::timestamptz);

-- name: history_maintain.drop_sql
SELECT format('DROP TABLE %%I', %(name)s::text);

-- name: history_maintain.prune
-- One bounded chunk of rows past their own retention, outside the partitions
-- a drop will remove (skip), with their attempt logs. Rows another
-- transaction holds are left for the next chunk.
WITH doomed AS (
    SELECT h.id, h.finalized_at
      FROM hopper_job_history h
     WHERE ((h.state = 'completed' AND h.finalized_at < %(completed_before)s)
         OR (h.state IN ('canceled', 'discarded') AND h.finalized_at < %(failed_before)s))
       AND h.tableoid::regclass::text <> ALL (%(skip)s::text[])
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), logs AS (
    DELETE FROM hopper_job_log l USING doomed d WHERE l.job_id = d.id
)
DELETE FROM hopper_job_history h
 USING doomed d
 WHERE h.id = d.id AND h.finalized_at = d.finalized_at;

-- name: history_maintain.count_expired
SELECT count(*) FROM (
    SELECT 1 FROM hopper_job_history h
     WHERE ((h.state = 'completed' AND h.finalized_at < %(completed_before)s)
         OR (h.state IN ('canceled', 'discarded') AND h.finalized_at < %(failed_before)s))
       AND h.tableoid::regclass::text <> ALL (%(skip)s::text[])
     LIMIT %(limit)s) AS s;

-- name: history_maintain.orphan_batches
-- One bounded chunk of completed batches that nothing refers to any more: no
-- job of theirs is live or in history, and no callback of theirs (metadata
-- batch_id) is live, so no get_batch from a callback can miss them. Their
-- leftover progress rows go with them. Rows another transaction holds wait
-- for the next pass.
WITH doomed AS (
    SELECT b.id
      FROM hopper_batch b
     WHERE b.completed_at IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.batch_id = b.id)
       AND NOT EXISTS (SELECT 1 FROM hopper_job_history h WHERE h.batch_id = b.id)
       AND NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.metadata->>'batch_id' = b.id::text)
     ORDER BY b.id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), progress AS (
    DELETE FROM hopper_batch_progress p USING doomed d WHERE p.batch_id = d.id
)
DELETE FROM hopper_batch b USING doomed d WHERE b.id = d.id;

-- name: history_maintain.orphan_edges
-- One bounded chunk of workflow edges whose dependent is gone from live and
-- history: nothing promotes or shows it again.
DELETE FROM hopper_job_dependency d
 WHERE d.id IN (
    SELECT x.id
      FROM hopper_job_dependency x
     WHERE NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.id = x.job_id)
       AND NOT EXISTS (SELECT 1 FROM hopper_job_history h WHERE h.id = x.job_id)
     LIMIT %(limit)s);

-- name: history_maintain.orphan_steps
-- One bounded chunk of step-ledger rows whose job is gone from live and
-- history (a discarded or canceled run keeps its ledger as evidence only as
-- long as the run itself is kept).
DELETE FROM hopper_job_step s
 WHERE s.id IN (
    SELECT x.id
      FROM hopper_job_step x
     WHERE NOT EXISTS (SELECT 1 FROM hopper_job j WHERE j.id = x.job_id)
       AND NOT EXISTS (SELECT 1 FROM hopper_job_history h WHERE h.id = x.job_id)
     LIMIT %(limit)s);

-- name: history_partitions
SELECT c.relname,
       pg_get_expr(c.relpartbound, c.oid),
       c.reltuples::bigint,
       pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'hopper_job_history'::regclass
 ORDER BY c.relname;

-- name: history_index
-- (parent index, partition) pairs where the partition has no index attached
-- to the parent's: what a pass builds. The tail of the parent's definition
-- (" USING btree (kind, id) WHERE ...") is reused for the partition's index.
SELECT pc.relname,
       substring(pg_get_indexdef(pi.indexrelid) FROM ' USING .*$'),
       pi.indisunique,
       part.relname
  FROM pg_index pi
  JOIN pg_class pc ON pc.oid = pi.indexrelid
  CROSS JOIN LATERAL (
        SELECT c.oid, c.relname
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = pi.indrelid) AS part
 WHERE pi.indrelid = 'hopper_job_history'::regclass
   AND NOT EXISTS (
        SELECT 1
          FROM pg_inherits ii
          JOIN pg_index ci ON ci.indexrelid = ii.inhrelid
         WHERE ii.inhparent = pi.indexrelid AND ci.indrelid = part.oid)
 ORDER BY pc.relname, part.relname;

-- name: history_index.try_lock
-- One builder at a time across leaders; never waited for.
SELECT pg_try_advisory_lock(hashtext('hopper_history_index'));

-- name: history_index.unlock
SELECT pg_advisory_unlock(hashtext('hopper_history_index'));

-- name: history_index.settings
SELECT current_setting('lock_timeout'), current_setting('statement_timeout');

-- name: history_index.set
-- Session-level: the builds run in autocommit, outside any transaction.
SELECT set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('statement_timeout', %(statement_timeout)s, false);

-- name: history_index.wait_lock
-- The builder's lock, waited for and held to the end of the transaction: what
-- a migration takes before it declares or drops a parent index of history, so
-- that it never interleaves with a pass (which holds it from its listing on).
SELECT pg_advisory_xact_lock(hashtext('hopper_history_index'));

-- name: history_index.declare_sql
-- A parent index of history, declared on the parent only (catalog only).
SELECT format('CREATE INDEX IF NOT EXISTS %%I ON ONLY hopper_job_history ', %(name)s::text)
       || %(tail)s::text;

-- name: history_index.undeclare_sql
-- A parent index, with the copies attached to it, or a copy attached to none.
SELECT format('DROP INDEX IF EXISTS %%I', %(name)s::text);

-- name: history_index.parents
SELECT c.relname
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'hopper_job_history'::regclass
 ORDER BY c.relname;

-- name: history_index.unattached
-- Indexes of history partitions attached to no parent index, with their
-- partition (transient copies of a rebuild are the repair's).
SELECT c.relname, part.relname
  FROM pg_inherits p
  JOIN pg_class part ON part.oid = p.inhrelid
  JOIN pg_index i ON i.indrelid = part.oid
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE p.inhparent = 'hopper_job_history'::regclass
   AND NOT EXISTS (SELECT 1 FROM pg_inherits a WHERE a.inhrelid = i.indexrelid)
   AND c.relname !~ '_cc(new|old)[0-9]*$'
 ORDER BY c.relname;

-- name: history_index.existing
-- An index of that name on the partition: valid (built, to attach) or not
-- (a failed concurrent build's leftover, to drop and build again).
SELECT i.indisvalid
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE c.relname = %(name)s AND i.indrelid = to_regclass(%(partition)s);

-- name: history_index.build_sql
SELECT format('CREATE %%sINDEX CONCURRENTLY %%I ON %%I',
              CASE WHEN %(unique)s THEN 'UNIQUE ' ELSE '' END,
              %(name)s::text, %(partition)s::text) || %(tail)s::text;

-- name: history_index.drop_sql
SELECT format('DROP INDEX CONCURRENTLY IF EXISTS %%I', %(name)s::text);

-- name: history_index.attach_sql
SELECT format('ALTER INDEX %%I ATTACH PARTITION %%I', %(parent)s::text, %(name)s::text);

-- name: history_index.reindex_sql
SELECT format('REINDEX INDEX CONCURRENTLY %%I', %(name)s::text);

-- name: history_index.repair
-- Invalid indexes of hopper's tables (live tables, history partitions), with
-- their table and whether each is the transient copy of an interrupted
-- REINDEX CONCURRENTLY (*_ccnew, *_ccold), to drop rather than rebuild. A
-- partitioned index is left out: it is valid once every partition has its
-- index attached, which the builds see to. Transient copies come first.
SELECT c.relname, t.relname, c.relname ~ '_cc(new|old)[0-9]*$'
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_class t ON t.oid = i.indrelid
 WHERE NOT i.indisvalid
   AND c.relkind = 'i'
   AND t.relnamespace = current_schema()::regnamespace
   AND t.relname LIKE 'hopper\_%%'
 ORDER BY 3 DESC, c.relname;

-- name: history_index.repair_leftovers
-- The transient copies a failed REINDEX CONCURRENTLY left on a table.
SELECT c.relname
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = to_regclass(%(table)s)
   AND NOT i.indisvalid
   AND c.relname ~ '_cc(new|old)[0-9]*$';

-- name: history_index.invalid
SELECT c.relname
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'hopper_job_history'::regclass AND NOT i.indisvalid
 ORDER BY c.relname;

-- name: jobs_maintain
-- Statistics of the hot tables: dead tuples, rows changed since the last
-- analyze, and the planner's row estimate against the live count.
SELECT s.relname, s.n_dead_tup, s.n_live_tup, s.n_mod_since_analyze, c.reltuples::bigint
  FROM pg_stat_user_tables s
  JOIN pg_class c ON c.oid = s.relid
 WHERE s.relname = ANY (%(tables)s::text[]) AND s.schemaname = current_schema()
 ORDER BY s.relname;

-- name: jobs_maintain.lock_timeout
SELECT current_setting('lock_timeout'), set_config('lock_timeout', %(value)s, false);

-- name: jobs_maintain.restore
SELECT set_config('lock_timeout', %(value)s, false);

-- name: jobs_maintain.vacuum_sql
-- SKIP_LOCKED: while autovacuum (or another leader) works the table, skip it.
SELECT format('VACUUM (ANALYZE, SKIP_LOCKED) %%I', %(table)s::text);

-- name: jobs_maintain.analyze_sql
SELECT format('ANALYZE (SKIP_LOCKED) %%I', %(table)s::text);
