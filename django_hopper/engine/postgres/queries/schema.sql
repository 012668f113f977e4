-- The PostgreSQL engine's queries for the schema: its version and the
-- migration lock.

-- name: schema_state.exists
-- Which of the tables the version is read from exist: none before the first
-- migrate, no floor table before the migration that adds it.
SELECT to_regclass('django_migrations') IS NOT NULL,
       to_regclass('hopper_schema_floor') IS NOT NULL

-- name: schema_state
-- variant: schema_state.floor FLOOR
-- The newest applied hopper migration's number, and the oldest code version
-- any applied migration declared it still serves. No lock: a migration in
-- progress is not waited for.
SELECT coalesce(max(substring(name FROM '^[0-9]+')::int), 0),
       /*IF FLOOR*/(SELECT coalesce(max(code_version), 0) FROM hopper_schema_floor)/*ELSE*/0/*END*/
  FROM django_migrations
 WHERE app = 'django_hopper'

-- name: index_valid
-- Whether an index of that name (in the current schema) is valid: an
-- interrupted CREATE INDEX CONCURRENTLY leaves one that is not.
SELECT i.indisvalid
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE c.relname = %(name)s AND c.relnamespace = current_schema()::regnamespace

-- name: schema_lock
-- The migration lock, a session-level advisory lock of this database, tried
-- and never waited for: a statement waiting here would hold a snapshot, which
-- the holder's CREATE INDEX CONCURRENTLY waits out, while the holder keeps the
-- lock until its migrations end.
SELECT pg_try_advisory_lock(hashtext('hopper_migrate'))

-- name: schema_lock.holder
-- Who holds the migration lock, for the message of a process waiting for it.
SELECT a.pid, coalesce(host(a.client_addr), 'local'), a.application_name, a.backend_start
  FROM pg_locks l
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.objid = hashtext('hopper_migrate')::oid
 LIMIT 1

-- name: schema_lock.release
SELECT pg_advisory_unlock(hashtext('hopper_migrate'))
