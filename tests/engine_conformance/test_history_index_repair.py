"""history_index repairs the invalid indexes interrupted concurrent builds leave.

The invalid indexes are made for real: a ``CREATE INDEX CONCURRENTLY`` that
fails half-way (a unique index over duplicates, an expression that divides
by zero on one row) leaves its index behind, invalid. Engines without
concurrent builds (``supports_concurrent_index_builds``) have nothing to repair.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import HistoryIndexParams, HistoryIndexResult
from django_hopper.exceptions import HistoryIndexRepairError, InvalidJob
from tests.factories import HistoryFactory
from tests.support.indexes import (
    DIVIDES,
    UNIQUE,
    concurrent_builds,
    execute,
    fails,
    invalid_expression_index,
    invalid_unique_index,
    leftovers,
    make_duplicates,
    valid,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pg(tx_engine: BaseEngine) -> Iterator[BaseEngine]:
    """The engine, where it has concurrent builds; the test's indexes dropped afterwards."""
    yield from concurrent_builds(tx_engine)


def test_history_index__has_nothing_to_repair_without_concurrent_builds(
    tx_engine: BaseEngine,
) -> None:
    if tx_engine.features.supports_concurrent_index_builds:
        pytest.skip("engine capability: concurrent index builds (the repair tests below cover it)")

    assert tx_engine.history_index(HistoryIndexParams()) == HistoryIndexResult()


def test_history_index__rebuilds_an_invalid_index_a_failed_concurrent_build_left(
    pg: BaseEngine,
) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    execute(
        "DELETE FROM hopper_job WHERE kind = 'tests.same' AND ctid <> "
        "(SELECT min(ctid) FROM hopper_job WHERE kind = 'tests.same')"
    )

    result = pg.history_index(HistoryIndexParams())

    assert result.repaired == [UNIQUE]
    assert UNIQUE not in result.invalid
    assert valid(UNIQUE) is True
    again = pg.history_index(HistoryIndexParams())
    assert (again.repaired, again.removed, again.repair_errors) == ([], [], {})


def test_history_index__reports_a_failed_repair_once_the_rest_of_the_pass_is_done(
    pg: BaseEngine,
) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    invalid_expression_index(pg)

    with pytest.raises(HistoryIndexRepairError) as caught:
        pg.history_index(HistoryIndexParams())

    result = caught.value.result
    assert isinstance(result, HistoryIndexResult)
    assert result.repaired == [DIVIDES]
    assert valid(DIVIDES) is True
    assert UNIQUE in result.invalid
    assert set(caught.value.failures) == {UNIQUE}
    assert "duplicated" in caught.value.failures[UNIQUE] or "unique" in str(caught.value)
    assert valid(UNIQUE) is False
    assert leftovers() == [], "the failed rebuild's copy was left behind"


def test_history_index__leaves_an_index_named_in_skip_repair_invalid(pg: BaseEngine) -> None:
    make_duplicates(pg)
    invalid_unique_index()

    assert pg.index_valid(UNIQUE) is False

    result = pg.history_index(HistoryIndexParams(skip_repair=(UNIQUE,)))

    assert result.repaired == []
    assert result.repair_errors == {}
    assert UNIQUE in result.invalid
    assert valid(UNIQUE) is False


def test_history_index__drops_the_copy_an_interrupted_rebuild_left_and_repairs(
    pg: BaseEngine,
) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    fails(f"REINDEX INDEX CONCURRENTLY {UNIQUE}")  # interrupted: leaves *_ccnew
    [copy] = leftovers()
    execute(
        "UPDATE hopper_job SET kind = 'tests.other' WHERE ctid = "
        "(SELECT max(ctid) FROM hopper_job WHERE kind = 'tests.same')"
    )

    result = pg.history_index(HistoryIndexParams())

    assert result.removed == [copy]
    assert result.repaired == [UNIQUE]
    assert leftovers() == []
    assert valid(UNIQUE) is True


def test_history_index__defers_a_repair_held_off_by_a_transaction_on_the_table(
    pg: BaseEngine,
) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    execute("DELETE FROM hopper_job WHERE kind = 'tests.same'")
    settings = connection.get_connection_params()
    settings.pop("cursor_factory", None)
    settings.pop("context", None)
    with psycopg.connect(**settings) as other:
        # What a build under way holds, and any VACUUM or ANALYZE of the table.
        other.execute("LOCK TABLE hopper_job IN SHARE UPDATE EXCLUSIVE MODE")

        result = pg.history_index(HistoryIndexParams(lock_timeout=dt.timedelta(milliseconds=50)))

        assert result.deferred == [UNIQUE]
        assert result.repaired == []
    assert valid(UNIQUE) is False
    assert leftovers() == []
    assert pg.history_index(HistoryIndexParams()).repaired == [UNIQUE]


def test_history_index__reports_busy_while_another_session_holds_the_build_lock(
    pg: BaseEngine,
) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    settings = connection.get_connection_params()
    settings.pop("cursor_factory", None)
    settings.pop("context", None)
    with psycopg.connect(**settings, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('hopper_history_index'))")

        result = pg.history_index(HistoryIndexParams())

    assert result.busy == UNIQUE
    assert result.repaired == []
    assert valid(UNIQUE) is False


@pytest.mark.parametrize("skip_repair", ["idx", ("",), (1,)])
def test_history_index__refuses_skip_repair_that_is_not_a_sequence_of_names(
    tx_engine: BaseEngine, skip_repair: object
) -> None:
    with pytest.raises(InvalidJob) as caught:
        tx_engine.history_index(HistoryIndexParams(skip_repair=skip_repair))  # type: ignore[arg-type]

    assert caught.value.field == "skip_repair"


def test_history_index__repairs_a_partition_only_when_the_pass_does_not_skip_it(
    pg: BaseEngine,
) -> None:
    job = HistoryFactory(priority=0, now=pg.now())
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM hopper_job_history WHERE id = %s", [job.id]
        )
        (partition,) = cursor.fetchone()
    fails(f"CREATE INDEX CONCURRENTLY {DIVIDES} ON {partition} ((100 / priority))")
    execute(f"UPDATE hopper_job_history SET priority = 1 WHERE id = '{job.id}'")

    skipped = pg.history_index(HistoryIndexParams(skip=(partition,)))
    assert skipped.repaired == []
    assert valid(DIVIDES) is False

    assert pg.history_index(HistoryIndexParams()).repaired == [DIVIDES]
    assert valid(DIVIDES) is True
