"""history_maintain: retention by partition drops (PostgreSQL) or chunked deletes."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import HistoryMaintainParams
from django_hopper.models import JobHistory, JobLog
from tests.factories import HistoryFactory, JobLogFactory

DAY = dt.timedelta(days=1)
COMPLETED = 7 * DAY
FAILED = 30 * DAY


def maintain(engine: BaseEngine, now: dt.datetime, **params: Any) -> Any:
    e: Any = engine
    return e.history_maintain(
        HistoryMaintainParams(
            completed_retention=COMPLETED, failed_retention=FAILED, now=now, **params
        )
    )


def partitions(engine: BaseEngine) -> set[str]:
    """Names of history's partitions, read from pg_inherits."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'hopper_job_history'::regclass"
        )
        return {row[0] for row in cursor.fetchall()}


def day_name(value: dt.datetime) -> str:
    return f"hopper_job_history_p{value.astimezone(dt.UTC):%Y%m%d}"


def ids(*rows: Any) -> set[Any]:
    return {row.id for row in rows}


def history_ids() -> set[Any]:
    return set(JobHistory.objects.values_list("id", flat=True))


@pytest.fixture
def partitioned(engine: BaseEngine) -> Iterator[None]:
    """Skip engines without history partitions; drop the day partitions a test made."""
    if not engine.features.supports_history_partitions:
        pytest.skip("this engine keeps history in one table (no partitions)")
    yield
    drop_day_partitions()


def drop_day_partitions() -> None:
    with connection.cursor() as cursor:
        for name in [p for p in partitions_raw(cursor) if p != "hopper_job_history_default"]:
            cursor.execute(f'DROP TABLE IF EXISTS "{name}"')


def partitions_raw(cursor: Any) -> list[str]:
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'hopper_job_history'::regclass"
    )
    return [row[0] for row in cursor.fetchall()]


# -- every engine ------------------------------------------------------------


def test_retention_never_loses_a_job_younger_than_its_retention(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    old_done = HistoryFactory(now=db_now - 8 * DAY)
    young_done = HistoryFactory(now=db_now - 6 * DAY)
    HistoryFactory(now=db_now - 31 * DAY, discarded=True)  # past its 30 days
    young_failed = HistoryFactory(now=db_now - 8 * DAY, canceled=True)
    JobLogFactory(job_id=old_done.id)
    JobLogFactory(job_id=young_done.id)
    result = maintain(engine, db_now)
    assert result.pruned == 2
    assert history_ids() == ids(young_done, young_failed)
    assert ids(old_done).isdisjoint(JobLog.objects.values_list("job_id", flat=True))
    assert JobLog.objects.filter(job_id=young_done.id).exists()


def test_retention_deletes_in_bounded_chunks(engine: BaseEngine, db_now: dt.datetime) -> None:
    for _ in range(5):
        HistoryFactory(now=db_now - 10 * DAY)
    result = maintain(engine, db_now, chunk_size=2, max_chunks=2, create=False, drop=False)
    assert result.pruned == 4
    assert JobHistory.objects.count() == 1
    assert maintain(engine, db_now, chunk_size=2, create=False, drop=False).pruned == 1


def test_a_dry_run_changes_nothing(engine: BaseEngine, db_now: dt.datetime) -> None:
    HistoryFactory(now=db_now - 10 * DAY)
    before = [(p.name, p.rows_estimate) for p in engine.history_partitions()]  # type: ignore[attr-defined]
    result = maintain(engine, db_now, dry_run=True)
    assert result.pruned == 1
    assert JobHistory.objects.count() == 1
    assert [(p.name, p.rows_estimate) for p in engine.history_partitions()] == before  # type: ignore[attr-defined]


def test_sqlite_like_engines_have_no_partitions_to_create_or_drop(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    if engine.features.supports_history_partitions:
        pytest.skip("this engine partitions history")
    result = maintain(engine, db_now)
    assert (result.created, result.dropped, result.deferred) == ([], [], [])


# -- engines with history partitions ------------------------------------------


@pytest.mark.usefixtures("partitioned")
def test_partitions_are_created_ahead_and_expired_ones_dropped_whole(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    past = db_now - 40 * DAY
    created = maintain(engine, past, create_ahead=2).created
    assert created == [day_name(past + i * DAY) for i in range(3)]
    done = HistoryFactory(now=past + DAY)
    failed = HistoryFactory(now=past + 2 * DAY, discarded=True)
    JobLogFactory(job_id=done.id)
    keep = HistoryFactory(now=db_now - DAY)
    result = maintain(engine, db_now, create_ahead=2)
    assert sorted(result.dropped) == created
    assert result.created == [day_name(db_now + i * DAY) for i in range(3)]
    assert result.pruned == 0
    names = partitions(engine)
    assert names.isdisjoint(created)
    assert set(result.created) <= names
    assert history_ids() == ids(keep)
    assert not JobLog.objects.filter(job_id=done.id).exists()
    assert failed.id not in history_ids()


@pytest.mark.usefixtures("partitioned")
def test_a_day_past_the_shorter_retention_moves_its_survivors_to_default(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    day = db_now - 10 * DAY
    maintain(engine, day, create_ahead=0)
    done = HistoryFactory(now=day)
    failed = HistoryFactory(now=day, discarded=True)
    result = maintain(engine, db_now, create_ahead=0)
    assert result.dropped == [day_name(day)]
    assert day_name(day) not in partitions(engine)
    assert history_ids() == ids(failed)  # the failed job is within its 30 days
    assert done.id not in history_ids()


@pytest.mark.usefixtures("partitioned")
def test_a_day_with_too_many_survivors_is_kept_and_pruned(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    day = db_now - 10 * DAY
    maintain(engine, day, create_ahead=0)
    HistoryFactory(now=day)
    failed = HistoryFactory(now=day, discarded=True)
    result = maintain(engine, db_now, create_ahead=0, move_limit=0)
    assert result.kept == [day_name(day)]
    assert result.pruned == 1
    assert day_name(day) in partitions(engine)
    assert history_ids() == ids(failed)


@pytest.mark.usefixtures("partitioned")
def test_a_day_whose_rows_sit_in_default_stays_in_default(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    # Moving rows out of DEFAULT would race readers planned before the attach.
    row = HistoryFactory(now=db_now)  # lands in DEFAULT: no partition for today yet
    result = maintain(engine, db_now, create_ahead=1)
    assert result.created == [day_name(db_now + DAY)]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM hopper_job_history WHERE id = %s", [row.id]
        )
        assert cursor.fetchone()[0] == "hopper_job_history_default"


@pytest.mark.django_db(transaction=True)
def test_a_partition_held_by_a_long_transaction_is_deferred_not_waited_on(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_history_partitions:
        pytest.skip("this engine keeps history in one table (no partitions)")
    import psycopg

    now = tx_engine.now()
    day = now - 40 * DAY
    try:
        maintain(tx_engine, day, create_ahead=0)
        HistoryFactory(now=day)
        settings = connection.settings_dict
        other = psycopg.connect(
            dbname=settings["NAME"], host=settings["HOST"], port=settings["PORT"],
            user=settings["USER"], password=settings["PASSWORD"] or None,
        )  # fmt: skip
        try:
            # A long transaction that read the day holds a lock the drop needs.
            other.execute(f'SELECT count(*) FROM "{day_name(day)}"').fetchone()
            started = time.monotonic()
            result = maintain(
                tx_engine, now, create_ahead=0, lock_timeout=dt.timedelta(milliseconds=50)
            )
            assert time.monotonic() - started < 5
            assert result.deferred == [day_name(day)]
            assert result.pruned == 0  # a deferred day is not deleted row by row either
            assert day_name(day) in partitions(tx_engine)
        finally:
            other.rollback()
            other.close()
        assert maintain(tx_engine, now, create_ahead=0).dropped == [day_name(day)]
    finally:
        drop_day_partitions()
