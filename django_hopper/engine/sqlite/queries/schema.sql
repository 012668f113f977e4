-- The SQLite engine's queries for the schema: its version and the migration
-- lock.

-- name: schema_state.exists
SELECT (SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'django_migrations'),
       (SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'hopper_schema_floor');

-- name: schema_state
-- variant: schema_state.floor FLOOR
-- The newest applied hopper migration's number (the digits its name starts
-- with), and the oldest code version any applied migration declared.
SELECT coalesce(max(CAST(substr(name, 1, instr(name, '_') - 1) AS INTEGER)), 0),
       /*IF FLOOR*/(SELECT coalesce(max(code_version), 0) FROM hopper_schema_floor)/*ELSE*/0/*END*/
  FROM django_migrations
 WHERE app = 'django_hopper' AND instr(name, '_') > 1;

-- name: index_valid
-- An SQLite index exists whole or not at all: its build blocks writers and
-- either commits or leaves nothing.
SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = %(name)s;

-- name: schema_lock
-- The migration lock: an exclusive transaction on a lock database of its own
-- beside the database file (the database's own write lock would stop the
-- migrations themselves). SQLite's file locks make it cross-process, and the
-- operating system drops it with the process that held it.
BEGIN EXCLUSIVE;

-- name: schema_lock.release
ROLLBACK;
