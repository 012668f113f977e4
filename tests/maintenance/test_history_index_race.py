"""A migration changing history's parent indexes against the leader's HistoryIndexer.

The interleavings are made one step at a time (a pass holding the builder's
lock from another session, the copies a pass leaves when its build or attach
meets a parent's drop), so nothing here waits on the clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError as DjangoDatabaseError
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import HistoryIndexParams, HistoryMaintainParams
from django_hopper.engine.postgres.history import index_name
from django_hopper.exceptions import HopperError
from django_hopper.migration_operations import IndexSQL
from tests.factories import HistoryFactory
from tests.maintenance.test_history_retention import drop_day_partitions
from tests.support.indexes import execute, valid

pytestmark = pytest.mark.django_db(transaction=True)

DAY = dt.timedelta(days=1)
KEPT = "hopper_history_test_idx"
GONE = "hopper_history_test_gone"


@pytest.fixture
def pg(tx_engine: BaseEngine) -> Iterator[Any]:
    """The engine where history is partitioned, with days ahead; the test's indexes
    dropped after."""
    if not tx_engine.features.supports_history_partitions:
        pytest.skip("history is one table: migrations build its indexes, no pass races them")
    e: Any = tx_engine
    now = e.now()
    e.history_maintain(
        HistoryMaintainParams(
            completed_retention=DAY, failed_retention=DAY, create_ahead=1, now=now
        )
    )
    try:
        yield e
    finally:
        for name in (KEPT, GONE, *copies(GONE), *copies(KEPT)):
            execute(f'DROP INDEX IF EXISTS "{name}"')
        drop_day_partitions()


def partitions() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'hopper_job_history'::regclass ORDER BY 1"
        )
        return [row[0] for row in cursor.fetchall()]


def copies(parent: str) -> list[str]:
    """Every index on a history partition named as a pass names the partition's copy."""
    names = {index_name(p, parent) for p in partitions()}
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'i' ORDER BY 1")
        return [row[0] for row in cursor.fetchall() if row[0] in names]


def attached(parent: str) -> dict[str, bool]:
    """The copies attached to ``parent``: name -> valid."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, x.indisvalid FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_index x ON x.indexrelid = c.oid "
            "WHERE i.inhparent = to_regclass(%s)",
            [parent],
        )
        return dict(cursor.fetchall())


def test_history_index__drops_the_copies_of_a_dropped_parent_instead_of_repairing_them(
    pg: Any,
) -> None:
    """A pass whose build or attach met the parent's drop left a valid copy
    attached to nothing; an interrupted build of a parent dropped since left an
    invalid one. The next pass drops both (a repair would rebuild an index that
    nothing attaches and every history row pays for) and leaves each partition
    exactly one valid copy of each parent."""
    execute(f"CREATE INDEX {KEPT} ON ONLY hopper_job_history (queue)")  # what a migration declares
    assert pg.history_index(HistoryIndexParams()).built
    now = pg.now()
    HistoryFactory(now=now)  # a row today, for the build that fails below
    today = next(p.name for p in pg.history_partitions() if p.lower and p.lower <= now < p.upper)
    other = next(p for p in partitions() if p != today)
    stray_valid, stray_invalid = index_name(other, GONE), index_name(today, GONE)
    # What the race left: the parent GONE is dropped; its copies are not.
    execute(f'CREATE INDEX "{stray_valid}" ON "{other}" (kind)')
    with pytest.raises(DjangoDatabaseError):  # a build interrupted half-way: invalid
        execute(f'CREATE INDEX CONCURRENTLY "{stray_invalid}" ON "{today}" ((1 / (fence - fence)))')
    assert (valid(stray_valid), valid(stray_invalid)) == (True, False)

    result = pg.history_index(HistoryIndexParams())
    again = pg.history_index(HistoryIndexParams())

    assert sorted(result.removed) == sorted([stray_valid, stray_invalid])
    assert result.repaired == [] and result.repair_errors == {}
    assert copies(GONE) == []
    assert sorted(attached(KEPT)) == sorted(index_name(p, KEPT) for p in partitions())
    assert all(attached(KEPT).values())
    assert (again.built, again.removed, again.repaired) == ([], [], [])


def _run(operation: IndexSQL) -> None:
    """Apply a migration operation as ``migrate`` does (``atomic = False``)."""
    state = MigrationLoader(connection).project_state()
    with connection.schema_editor(atomic=False) as editor:
        operation.database_forwards("django_hopper", editor, state, state)


def _holder() -> psycopg.Connection[Any]:
    settings = connection.settings_dict
    return psycopg.connect(
        dbname=settings["NAME"], host=settings["HOST"], port=settings["PORT"],
        user=settings["USER"], password=settings["PASSWORD"] or None, autocommit=True,
    )  # fmt: skip


def test_index_sql__waits_for_a_history_index_pass_and_drops_the_copies_it_left(
    pg: Any,
) -> None:
    """The migration's parent index DDL takes the builder's lock first: while a
    pass holds it (from its listing to its last build) the drop waits, so it
    never lands between a pass's build and its attach. Its drop then takes the
    copies a pass left unattached along with the parent, so a run of migrate
    leaves no copy of an index it dropped."""
    create = IndexSQL(
        feature="supports_history_partitions",
        name=KEPT,
        table="hopper_job_history",
        definition="USING btree (queue)",
        history=True,
    )
    drop = IndexSQL(
        feature="supports_history_partitions",
        name=KEPT,
        table="hopper_job_history",
        definition="USING btree (queue)",
        drop=True,
        history=True,
    )
    _run(create)
    _run(create)  # re-runnable
    left = index_name(partitions()[0], KEPT)
    execute(f'CREATE INDEX "{left}" ON "{partitions()[0]}" (queue)')  # built, not attached yet

    holder = _holder()
    try:
        # A pass under way holds the builder's lock.
        lock = "SELECT pg_try_advisory_lock(hashtext('hopper_history_index'))"
        assert holder.execute(lock).fetchone() == (True,)
        execute("SET lock_timeout = '100ms'")
        with pytest.raises(HopperError, match="lock timeout"):
            _run(drop)
        assert valid(KEPT) is False  # untouched: declared, copies still to attach
        assert valid(left) is True
    finally:
        execute("RESET lock_timeout")
        holder.close()  # the pass ends: its lock goes with its session

    _run(drop)
    _run(drop)  # re-runnable

    assert valid(KEPT) is None
    assert copies(KEPT) == []


def test_hopper_indexes__says_it_removed_a_copy_of_a_dropped_index(pg: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    stray = index_name(partitions()[0], GONE)
    execute(f'CREATE INDEX "{stray}" ON "{partitions()[0]}" (kind)')
    out = StringIO()

    call_command("hopper_indexes", stdout=out)

    assert f"removed   {stray} (a partition's copy of a dropped index)" in out.getvalue()
    assert valid(stray) is None


def test_history_index__leaves_an_operators_own_index_on_one_partition_alone(pg: Any) -> None:
    """An index an operator made on one partition (``CREATE INDEX ON <partition>
    (subject)``: PostgreSQL names it ``<partition>_subject_idx``) is no copy of a
    parent index: a pass never drops it."""
    execute(f"CREATE INDEX {KEPT} ON ONLY hopper_job_history (queue)")
    assert pg.history_index(HistoryIndexParams()).built
    partition = partitions()[0]
    execute(f'CREATE INDEX ON "{partition}" (subject)')
    own = f"{partition}_subject_idx"
    try:
        result = pg.history_index(HistoryIndexParams())
        assert own not in result.removed
        assert valid(own)
    finally:
        execute(f'DROP INDEX IF EXISTS "{own}"')
