"""Every migration is safe to run while workers run (PostgreSQL).

A fresh database is migrated from zero to the latest migration one step at a
time. During each step a worker's transaction is open on every hopper table
(ROW EXCLUSIVE, what an insert, claim or finalize holds) for a while, and a
probe keeps asking for the same lock with a short ``lock_timeout``, as the
next insert, claim or finalize would. A step that needs a lock conflicting
with writes (a plain ``CREATE INDEX``: SHARE; ``ALTER TABLE``, ``DROP INDEX``:
ACCESS EXCLUSIVE) queues behind the open transaction, and every write queues
behind it: the probe times out. Only the steps listed in
``BRIEF_ACCESS_EXCLUSIVE`` may do that (catalog-only changes that
docs/deploying.md says to run with a ``lock_timeout``); an index on a live
table is built concurrently. The probe's longest wait per step is printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from django_hopper import migrations as hopper_migrations
from tests.support.runtime import ROOT
from tests.topology.conftest import requires_postgres

pytestmark = [pytest.mark.processes, requires_postgres]

#: Steps that briefly need ACCESS EXCLUSIVE on a live table (catalog-only: a
#: nullable column without a default), and why that is acceptable.
BRIEF_ACCESS_EXCLUSIVE = {
    "0002_workflows_periodic": "ADD COLUMN step (nullable, no default): a catalog change",
    "0007_client_completed": "ADD COLUMN completed (nullable, no default) on the small "
    "clients table: a catalog change",
    "0008_pass_leases": "ADD COLUMN lease_began_at / admission_misses (nullable, no default) "
    "on the job tables: catalog changes",
    "0010_subject_erasure": "ADD COLUMN subject / erased_at (nullable, no default) on the job "
    "tables: catalog changes",
    "0012_route_and_periodic_controls": "ADD COLUMN paused_at / disabled_at / enabled_at "
    "(nullable, no default) and DROP NOT NULL on the small subscription, stream consumer "
    "and periodic slot tables: catalog changes",
    "0014_claimed_ahead": "ADD COLUMN claimed_ahead_at (nullable, no default) on the job "
    "tables: a catalog change",
    "0015_partial_tags_index": "CREATE INDEX ON ONLY / DROP INDEX of the tags GIN on the "
    "partitioned history (a partitioned index is neither built nor dropped concurrently): "
    "catalog changes; the live table's are concurrent",
}
#: How long the worker's transaction stays open during each step (seconds).
HOLD = 2.0
#: The probe's lock_timeout: a write waiting this long is counted as blocked.
PROBE_TIMEOUT_MS = 300


def migration_names() -> list[str]:
    folder = Path(hopper_migrations.__file__).parent
    return sorted(p.stem for p in folder.glob("0*.py"))


def server() -> dict[str, Any]:
    from django.conf import settings

    db = settings.DATABASES.get("direct", settings.DATABASES["default"])
    return {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "password": db["PASSWORD"]}


@pytest.fixture
def fresh_database():
    """An empty database of its own, dropped afterwards."""
    name = "test_hopper_migrations_" + os.environ.get("HOPPER_TEST_DB_SUFFIX", "main")
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(**server(), dbname="postgres", autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(**server(), dbname="postgres", autocommit=True) as conn:
        conn.execute(drop)


def migrate_command(db_name: str, target: str) -> list[str]:
    return [sys.executable, "-m", "django", "migrate", "django_hopper", target, "-v", "0"]


def migrate_env(db_name: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "HOPPER_TEST_DATABASE": "postgres",
            "HOPPER_TEST_DB_NAME": db_name,
            "PYTHONPATH": str(ROOT),
        }
    )
    # Straight to the server: a bouncer (scripts/test's pass) is not where DDL goes.
    env.pop("HOPPER_TEST_PGBOUNCER_PORT", None)
    env["PGPORT"] = str(server()["port"])
    return env


def hopper_tables(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') "
        "AND c.relname LIKE 'hopper\\_%' AND NOT c.relispartition ORDER BY 1"
    ).fetchall()
    return [r[0] for r in rows]


def waiting(probe: psycopg.Connection[Any]) -> bool:
    """Return whether another session of the database waits for a lock (the migration)."""
    row = probe.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> pg_backend_pid())"
    ).fetchone()
    return bool(row and row[0])


def step_under_load(db_name: str, target: str) -> tuple[set[str], dict[str, float]]:
    """Apply one migration while a write transaction is open.

    Return the tables whose write lock the probe could not get within its
    lock_timeout, and the probe's longest wait per table (a figure only: on a
    loaded machine a probe is slow without waiting for any lock).
    """
    info = {**server(), "dbname": db_name}
    waits: dict[str, float] = {}
    blocked: set[str] = set()
    with psycopg.connect(**info) as worker, psycopg.connect(**info, autocommit=True) as probe:
        tables = hopper_tables(worker)
        for table in tables:
            worker.execute(
                sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(sql.Identifier(table))
            )
        proc = subprocess.Popen(
            migrate_command(db_name, target),
            cwd=ROOT,
            env=migrate_env(db_name),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        probe.execute(f"SET lock_timeout = '{PROBE_TIMEOUT_MS}ms'")
        # The worker's transaction ends HOLD seconds after the migration first
        # waits for a lock (the process needs a while to start), or when it ends.
        release_at: float | None = None
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if release_at is None and waiting(probe):
                release_at = time.monotonic() + HOLD
            if release_at is not None and time.monotonic() >= release_at:
                worker.commit()
                release_at = float("inf")
            for table in tables:
                started = time.monotonic()
                try:
                    with probe.transaction():
                        probe.execute(
                            sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(
                                sql.Identifier(table)
                            )
                        )
                except psycopg.errors.LockNotAvailable:
                    blocked.add(table)  # waited the whole lock_timeout for the lock
                waited = time.monotonic() - started
                waits[table] = max(waits.get(table, 0.0), waited)
            time.sleep(0.02)
        worker.commit()
        out = proc.communicate(timeout=120)[0].decode(errors="replace")
        assert proc.returncode == 0, f"migrate {target} failed: {out}"
    return blocked, waits


def test_migrations__every_step_lets_writes_go_on_but_the_documented_catalog_changes(
    fresh_database,
):
    names = migration_names()
    first = subprocess.run(
        migrate_command(fresh_database, names[0]),
        cwd=ROOT,
        env=migrate_env(fresh_database),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stdout + first.stderr

    blocking: dict[str, set[str]] = {}
    report = []
    for name in names[1:]:
        blocked, waits = step_under_load(fresh_database, name)
        if blocked:
            blocking[name] = blocked
        longest = max(waits.values(), default=0.0)
        verdict = f"writes blocked on {', '.join(sorted(blocked))}" if blocked else "writes went on"
        report.append(f"{name}: longest probe wait {longest:.3f}s ({verdict})")
    print("\n" + "\n".join(report))

    assert set(blocking) == set(BRIEF_ACCESS_EXCLUSIVE), blocking


def test_migrations__an_index_on_a_live_table_is_built_concurrently():
    from django.db.migrations.loader import MigrationLoader

    from django_hopper.migration_operations import AddIndexConcurrently, RemoveIndexConcurrently

    loader = MigrationLoader(None, ignore_no_migrations=True)
    plain = []
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        if app != "django_hopper" or name == "0001_initial":
            continue  # 0001 creates the tables: nothing lives in them yet
        for op in migration.operations:
            index_op = type(op).__name__ in ("AddIndex", "RemoveIndex")
            concurrent = isinstance(op, AddIndexConcurrently | RemoveIndexConcurrently)
            if index_op and not concurrent:
                plain.append(f"{name}: {op.describe()}")
            if concurrent:
                assert migration.atomic is False, f"{name} must say atomic = False"
    assert plain == []


def tag_indexes(db_name: str) -> dict[str, str]:
    """The tags indexes of the job tables: name -> definition (partitions left out)."""
    with psycopg.connect(**server(), dbname=db_name) as conn:
        rows = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename IN ('hopper_job', 'hopper_job_history') AND indexdef ~ 'tags'"
        ).fetchall()
    return {r[0]: r[1].split(" USING ", 1)[1] for r in rows}


def test_migrations__the_tags_indexes_become_partial_and_back(fresh_database):
    def migrate(target: str) -> None:
        done = subprocess.run(
            migrate_command(fresh_database, target),
            cwd=ROOT,
            env=migrate_env(fresh_database),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    full = {"hopper_job_tags_gin": "gin (tags)", "hopper_history_tags_gin": "gin (tags)"}
    partial = {
        "hopper_job_tags": "gin (tags) WHERE (tags <> '[]'::jsonb)",
        "hopper_history_tags": "gin (tags) WHERE (tags <> '[]'::jsonb)",
    }
    migrate("0014_claimed_ahead")
    assert tag_indexes(fresh_database) == full
    migrate("0015_partial_tags_index")
    assert tag_indexes(fresh_database) == partial
    migrate("0014_claimed_ahead")
    assert tag_indexes(fresh_database) == full
    # Re-run after a build left an invalid live index behind: it is built again.
    with psycopg.connect(**server(), dbname=fresh_database, autocommit=True) as conn:
        conn.execute("CREATE INDEX hopper_job_tags ON hopper_job USING gin (tags)")
        conn.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'hopper_job_tags'::regclass"
        )
    migrate("0015_partial_tags_index")
    assert tag_indexes(fresh_database) == partial


def test_migrations__an_alias_the_router_keeps_hopper_out_of_gets_nothing(fresh_database):
    # docs/deploying.md: allow_migrate(db, "django_hopper") false on an alias hopper
    # does not use. `migrate` there still runs hopper's migrations (and records
    # them); each operation must then leave the database alone, as Django's do.
    env = migrate_env(fresh_database)
    env["DJANGO_SETTINGS_MODULE"] = "tests.topology.routed_settings"
    for target in ([], ["zero"]):  # forwards to the latest, then back
        done = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "django_hopper", *target, "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        with psycopg.connect(**server(), dbname=fresh_database) as conn:
            assert hopper_tables(conn) == []
