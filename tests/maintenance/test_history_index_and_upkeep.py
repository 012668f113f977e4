"""history_index (per-partition concurrent builds) and jobs_maintain (upkeep)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    HistoryIndexParams,
    HistoryMaintainParams,
    JobInsertOpts,
    JobInsertParams,
    JobsMaintainParams,
)
from django_hopper.engine.rules import upkeep_action
from tests.maintenance.test_history_retention import drop_day_partitions

DAY = dt.timedelta(days=1)


def partition_indexes(name: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'hopper_history_test_idx'::regclass"
        )
        return {row[0] for row in cursor.fetchall() if row[0].startswith(name)}


@pytest.mark.django_db(transaction=True)
def test_an_index_added_to_history_is_built_per_partition_and_attached(
    tx_engine: BaseEngine,
) -> None:
    e: Any = tx_engine
    if not tx_engine.features.supports_history_partitions:
        assert e.history_index(HistoryIndexParams()).built == []
        return
    now = tx_engine.now()
    e.history_maintain(
        HistoryMaintainParams(
            completed_retention=DAY, failed_retention=DAY, create_ahead=1, now=now
        )
    )
    try:
        with connection.cursor() as cursor:
            # What a later migration does: declare the index on the parent only.
            cursor.execute(
                "CREATE INDEX hopper_history_test_idx ON ONLY hopper_job_history (queue)"
            )
        result = e.history_index(HistoryIndexParams())
        built = [b for b in result.built if b.endswith(".hopper_history_test_idx")]
        assert len(built) == len(e.history_partitions())
        assert "hopper_history_test_idx" not in result.invalid
        assert partition_indexes("hopper_job_history_default")
        again = e.history_index(HistoryIndexParams())
        assert (again.built, again.deferred, again.timed_out) == ([], [], [])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS hopper_history_test_idx")
        drop_day_partitions()


def test_history_index_refuses_to_run_inside_a_transaction(engine: BaseEngine) -> None:
    if not engine.features.supports_history_partitions:
        pytest.skip("nothing to build where history is one table")
    from django_hopper.exceptions import DatabaseError

    with pytest.raises(DatabaseError, match="outside a transaction"):
        engine.history_index(HistoryIndexParams())  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_jobs_maintain_vacuums_past_the_threshold_without_waiting(tx_engine: BaseEngine) -> None:
    e: Any = tx_engine
    result = e.jobs_maintain(JobsMaintainParams(vacuum_dead_tuples=0))
    if tx_engine.features.supports_history_partitions:  # the PostgreSQL engine
        assert result.vacuumed and result.analyzed
        assert result.tables["hopper_job"] == "vacuumed"
    else:
        # SQLite never vacuums; it analyzes only statistics an earlier test
        # left stale, after which they are current.
        assert not result.vacuumed
        again = e.jobs_maintain(JobsMaintainParams(vacuum_dead_tuples=0))
        assert (again.vacuumed, again.analyzed) == (False, False)


def test_jobs_maintain_does_nothing_below_the_thresholds(engine: BaseEngine) -> None:
    if not engine.features.supports_history_partitions:
        # SQLite's statistics outlive a test's rollback: settle what an
        # earlier test left stale first.
        engine.jobs_maintain(JobsMaintainParams())  # type: ignore[attr-defined]
    result = engine.jobs_maintain(JobsMaintainParams())  # type: ignore[attr-defined]
    assert (result.vacuumed, result.analyzed) == (False, False)


def _flush_table_statistics() -> None:
    """Publish this session's row counts to pg_stat_user_tables now (PostgreSQL
    publishes them at most once a second otherwise)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # a transaction ends: the counts are published


@pytest.mark.django_db(transaction=True)
def test_jobs_maintain_analyzes_once_the_estimate_is_off_and_then_not_again(
    tx_engine: BaseEngine,
) -> None:
    """The rule is the same on both engines: a table that grew past
    ``analyze_ratio`` times its estimate is analyzed once; right after, the
    estimate holds and nothing is analyzed."""
    e: Any = tx_engine
    params = JobsMaintainParams(analyze_min_rows=40, analyze_changes=1_000_000)
    # Whatever earlier tests left, the estimate now holds: the statistics of a
    # larger table outlive its draining (upkeep keeps them below analyze_min_rows).
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE hopper_job")
    _flush_table_statistics()
    e.jobs_maintain(params)
    _flush_table_statistics()
    settled = e.jobs_maintain(params)
    assert not settled.analyzed
    e.job_insert_many(
        [JobInsertParams(kind="k", queue="upkeep") for _ in range(400)], JobInsertOpts()
    )
    _flush_table_statistics()

    grown = e.jobs_maintain(params)
    _flush_table_statistics()
    again = e.jobs_maintain(params)

    assert grown.analyzed and grown.tables["hopper_job"] == "analyzed"
    assert not again.analyzed and "hopper_job" not in again.tables
    if connection.vendor == "sqlite":  # the file outlives the test: later tests plan without
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM sqlite_stat1")
            cursor.execute("ANALYZE sqlite_master")


@pytest.mark.parametrize(
    ("dead", "live", "changed", "estimate", "expected"),
    [
        (100_000, 10, 0, 10, "vacuum"),
        (10, 50_000, 0, 1_000, "analyze"),  # the planner thinks 1k rows, there are 50k
        (10, 1_000, 0, -1, "analyze"),  # never analyzed
        (10, 5_000, 100_000, 5_000, "analyze"),  # many changes since the last analyze
        (10, 5_000, 10, 4_000, None),
        (10, 50, 0, -1, None),  # too small to matter
        (10, 0, 0, 1_000_000, None),  # drained: keeps the statistics of its larger self
        (10, 999, 0, 1_000_000, None),  # refilling, still too small to measure
        (10, 5_000, 0, 1_000_000, "analyze"),  # shrank 200x, still large enough
        (20_000, 10, 100_000, 20_000, "vacuum"),  # a drained queue: analyze over dead rows
    ],
)
def test_upkeep_decides_from_table_statistics(
    dead: int, live: int, changed: int, estimate: int, expected: str | None
) -> None:
    assert upkeep_action(dead, live, changed, estimate, JobsMaintainParams()) == expected
