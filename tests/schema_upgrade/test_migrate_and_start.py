"""Deploying a schema with real processes: concurrent ``migrate`` runs, and workers
started against a schema their code does not go with.

Each test gets a fresh, empty database of its own (a PostgreSQL database, or an
SQLite file) and runs ``manage.py`` in subprocesses, as deploy hosts do.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest
from psycopg import sql

from django_hopper.schema import code_version
from tests.support.runtime import ROOT, wait_for

pytestmark = pytest.mark.processes

POSTGRES = os.environ.get("HOPPER_TEST_DATABASE", "sqlite") == "postgres"
HOPPER_MIGRATIONS = sorted(p.stem for p in (ROOT / "django_hopper" / "migrations").glob("0*.py"))


def server() -> dict[str, Any]:
    from django.conf import settings

    db = settings.DATABASES.get("direct", settings.DATABASES["default"])
    return {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "password": db["PASSWORD"]}


@pytest.fixture
def fresh_db(tmp_path: Path) -> Iterator[str]:
    """The name of an empty database of the engine under test, dropped afterwards."""
    if not POSTGRES:
        # Made as CREATE DATABASE makes one on PostgreSQL: the file exists, already in
        # the WAL mode the settings ask for. Two processes that open a file that is not
        # yet in WAL mode race to switch it, and SQLite fails the loser's switch at once
        # with "database is locked" (no busy wait), before any migration lock is taken.
        path = tmp_path / "fresh.sqlite3"
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        yield str(path)
        return
    name = "test_hopper_deploy_" + os.environ.get("HOPPER_TEST_DB_SUFFIX", "main")
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(**server(), dbname="postgres", autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(**server(), dbname="postgres", autocommit=True) as conn:
        conn.execute(drop)


def env(db_name: str) -> dict[str, str]:
    out = dict(os.environ)
    out.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "HOPPER_TEST_DB_NAME": db_name,
            "PYTHONPATH": str(ROOT),
        }
    )
    # Straight to the server: DDL and the migration lock do not go through a bouncer.
    out.pop("HOPPER_TEST_PGBOUNCER_PORT", None)
    if POSTGRES:
        out["PGPORT"] = str(server()["port"])
    return out


def manage(db_name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env(db_name),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run(db_name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env(db_name),
        capture_output=True,
        text=True,
        timeout=240,
    )


@contextmanager
def database(db_name: str) -> Iterator[Any]:
    """A plain DB-API connection to the fresh database (autocommit)."""
    if POSTGRES:
        with psycopg.connect(**server(), dbname=db_name, autocommit=True) as conn:
            yield conn
    else:
        conn = sqlite3.connect(db_name, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()


@contextmanager
def migration_lock_held(db_name: str) -> Iterator[None]:
    """Hold the database's migration lock from outside, as another host's migrate would."""
    if POSTGRES:
        with psycopg.connect(**server(), dbname=db_name, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(hashtext('hopper_migrate'))")
            yield
    else:
        conn = sqlite3.connect(f"{db_name}-hopper-migrate", isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            yield
        finally:
            conn.close()


def read_until(stream: IO[str], needle: str) -> str:
    """Read lines until one contains ``needle``; return everything read (EOF ends it too)."""
    seen = []
    for line in iter(stream.readline, ""):
        seen.append(line)
        if needle in line:
            break
    return "".join(seen)


def test_migrate__two_concurrent_runs_wait_for_the_lock_and_apply_each_migration_once(
    fresh_db: str,
) -> None:
    with migration_lock_held(fresh_db):
        first = manage(fresh_db, "migrate", "--no-input")
        second = manage(fresh_db, "migrate", "--no-input")
        try:
            # Both find the lock held and say so, before touching the schema.
            for proc in (first, second):
                assert proc.stdout is not None
                head = read_until(proc.stdout, "Waiting for the migration lock")
                assert "Waiting for the migration lock of database 'default'" in head, head
            with database(fresh_db) as conn:
                tables = conn.execute(
                    "SELECT count(*) FROM information_schema.tables "
                    "WHERE table_name = 'django_migrations'"
                    if POSTGRES
                    else "SELECT count(*) FROM sqlite_master WHERE name = 'django_migrations'"
                ).fetchone()[0]
            assert tables == 0, "a migrate ran while another held the lock"
        except BaseException:
            first.kill()
            second.kill()
            raise
    # Released: one migrates, the other waits for it and then finds nothing to do.
    outputs = [proc.communicate(timeout=240)[0] for proc in (first, second)]

    assert [first.returncode, second.returncode] == [0, 0], outputs
    assert sum("No migrations to apply." in out for out in outputs) == 1, outputs
    with database(fresh_db) as conn:
        duplicates = conn.execute(
            "SELECT app, name FROM django_migrations GROUP BY app, name HAVING count(*) > 1"
        ).fetchall()
        hopper = conn.execute(
            "SELECT name FROM django_migrations WHERE app = 'django_hopper' ORDER BY name"
        ).fetchall()
    assert duplicates == []
    assert [row[0] for row in hopper] == HOPPER_MIGRATIONS


#: A process that takes the migration lock through hopper and keeps it until killed.
HOLD_LOCK = """
import sys, time
import django
django.setup()
from django_hopper.schema import migration_lock
with migration_lock("default"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_migrate__takes_over_the_lock_of_a_holder_killed_with_sigkill(fresh_db: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK],
        cwd=ROOT,
        env=env(fresh_db),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    migrate = None
    try:
        assert holder.stdout is not None
        assert "held" in read_until(holder.stdout, "held")
        migrate = manage(fresh_db, "migrate", "--no-input")
        assert migrate.stdout is not None
        assert "Waiting for the migration lock" in read_until(
            migrate.stdout, "Waiting for the migration lock"
        )

        holder.kill()  # SIGKILL: no unlock, no clean close
        holder.wait(timeout=30)
        out = migrate.communicate(timeout=240)[0]
    finally:
        for proc in (holder, migrate):
            if proc is not None and proc.poll() is None:
                proc.kill()

    assert migrate.returncode == 0, out
    with database(fresh_db) as conn:
        hopper = conn.execute(
            "SELECT name FROM django_migrations WHERE app = 'django_hopper' ORDER BY name"
        ).fetchall()
    assert [row[0] for row in hopper] == HOPPER_MIGRATIONS


def test_worker__refuses_to_start_on_an_older_schema_naming_both_versions(
    fresh_db: str,
) -> None:
    older = HOPPER_MIGRATIONS[-2]
    migrated = run(fresh_db, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    back = run(fresh_db, "migrate", "django_hopper", older, "--no-input")
    assert back.returncode == 0, back.stdout + back.stderr

    worker = run(fresh_db, "hopper_worker", "--burst", "--no-maintenance")

    assert worker.returncode != 0
    message = worker.stderr
    assert f"hopper schema {int(older[:4])}" in message, message
    assert f"built for schema {code_version()}" in message, message
    assert "manage.py migrate django_hopper" in message, message
    with database(fresh_db) as conn:
        clients = conn.execute("SELECT count(*) FROM hopper_client").fetchone()[0]
    assert clients == 0, "the refused worker registered a client"


def test_worker__refuses_to_start_on_a_schema_that_no_longer_serves_its_code(
    fresh_db: str,
) -> None:
    migrated = run(fresh_db, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    with database(fresh_db) as conn:
        # What a later release's migration with RequireCode(version + 1) records.
        conn.execute(
            "INSERT INTO hopper_schema_floor (code_version, declared_at) "
            f"VALUES ({code_version() + 1}, CURRENT_TIMESTAMP)"
        )

    worker = run(fresh_db, "hopper_worker", "--burst", "--no-maintenance")
    maintain = run(fresh_db, "hopper_maintain", "--once")

    for proc in (worker, maintain):
        assert proc.returncode != 0
        assert f"built for schema {code_version()}" in proc.stderr, proc.stderr
        assert f"needs code built for schema {code_version() + 1} or later" in proc.stderr


def test_worker__starts_on_a_schema_one_migration_ahead_of_its_code(fresh_db: str) -> None:
    migrated = run(fresh_db, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    with database(fresh_db) as conn:
        # A later release migrated first (a rolling deploy): its migration is recorded.
        conn.execute(
            "INSERT INTO django_migrations (app, name, applied) "
            f"VALUES ('django_hopper', '{code_version() + 1:04d}_later', CURRENT_TIMESTAMP)"
        )

    worker = run(fresh_db, "hopper_worker", "--burst", "--no-maintenance")

    assert worker.returncode == 0, worker.stderr


def test_migrate__run_again_rebuilds_the_invalid_index_an_interrupted_build_left(
    fresh_db: str,
) -> None:
    if not POSTGRES:
        pytest.skip("an SQLite index build blocks writes and leaves no invalid index")
    before = run(fresh_db, "migrate", "django_hopper", "0005", "--no-input")
    assert before.returncode == 0, before.stdout + before.stderr
    with database(fresh_db) as conn:
        # 0006's index name, left invalid by a concurrent build that failed.
        conn.execute("CREATE TABLE scratch (x int)")
        conn.execute("INSERT INTO scratch VALUES (1), (1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY hopper_job_keyed ON scratch (x)")

    again = run(fresh_db, "migrate", "django_hopper", "0006", "--no-input")

    assert again.returncode == 0, again.stdout + again.stderr
    with database(fresh_db) as conn:
        row = conn.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'hopper_job_keyed'"
        ).fetchone()
    assert row[0] is True
    assert "ON public.hopper_job " in row[1] and "ordering_key IS NOT NULL" in row[1]


def test_migrate__killed_during_a_concurrent_build_completes_when_run_again(
    fresh_db: str,
) -> None:
    if not POSTGRES:
        pytest.skip("an SQLite index build blocks writes and is atomic: nothing is left half-done")
    before = run(fresh_db, "migrate", "django_hopper", "0005", "--no-input")
    assert before.returncode == 0, before.stdout + before.stderr
    with database(fresh_db) as probe, psycopg.connect(**server(), dbname=fresh_db) as writer:
        # A transaction that writes hopper_job: the concurrent build waits for it to end.
        writer.execute("LOCK TABLE hopper_job IN ROW EXCLUSIVE MODE")
        migrate = manage(fresh_db, "migrate", "django_hopper", "0006", "--no-input")
        try:

            def building() -> int | None:
                assert migrate.poll() is None, migrate.communicate()[0]
                row = probe.execute(
                    "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
                    "WHERE NOT l.granted AND a.datname = current_database() "
                    "AND a.query ILIKE 'CREATE INDEX CONCURRENTLY%'"
                ).fetchone()
                return row[0] if row else None

            backend = wait_for(building, timeout=120, step=0.1)
            # The deploy host dies mid-build, and its session with it.
            migrate.kill()
            migrate.wait(timeout=30)
            probe.execute("SELECT pg_terminate_backend(%s)", [backend])
        finally:
            if migrate.poll() is None:
                migrate.kill()
        writer.rollback()
        left = probe.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'hopper_job_keyed'"
        ).fetchone()
        assert left == (False,), "the interrupted build left no invalid index to test with"

    again = run(fresh_db, "migrate", "django_hopper", "0006", "--no-input")

    assert again.returncode == 0, again.stdout + again.stderr
    with database(fresh_db) as conn:
        valid = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'hopper_job_keyed'"
        ).fetchall()
        recorded = conn.execute(
            "SELECT count(*) FROM django_migrations WHERE name = '0006_keyed_claim_window'"
        ).fetchone()
    assert valid == [(True,)]
    assert recorded == (1,)
