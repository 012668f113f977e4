"""Index repair from the leader's HistoryIndexer and from ``manage.py hopper_indexes``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_hopper.engine.base import BaseEngine
from django_hopper.exceptions import HistoryIndexRepairError
from django_hopper.maintenance import HistoryIndexer
from tests.support.indexes import (
    UNIQUE,
    concurrent_builds,
    execute,
    invalid_unique_index,
    make_duplicates,
    valid,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pg(tx_engine: BaseEngine) -> Iterator[BaseEngine]:
    """The engine, where it has concurrent builds; the test's indexes dropped afterwards."""
    yield from concurrent_builds(tx_engine)


def indexes(*args: str) -> str:
    out = StringIO()
    call_command("hopper_indexes", *args, stdout=out)
    return out.getvalue()


def test_hopper_indexes__says_there_is_nothing_to_repair_without_concurrent_builds(
    tx_engine: BaseEngine,
) -> None:
    if tx_engine.features.supports_concurrent_index_builds:
        pytest.skip("engine capability: concurrent index builds (the repair tests below cover it)")

    assert "nothing to build or repair" in indexes()


def test_hopper_indexes__repairs_and_reports_each_index(pg: BaseEngine) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    execute("DELETE FROM hopper_job WHERE kind = 'tests.same'")

    out = indexes()

    assert f"repaired  {UNIQUE}" in out
    assert valid(UNIQUE) is True
    assert indexes() == "Every index is built and valid.\n"


def test_hopper_indexes__reports_the_rest_then_fails_on_a_failed_repair(pg: BaseEngine) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    out = StringIO()

    with pytest.raises(CommandError, match=UNIQUE):
        call_command("hopper_indexes", stdout=out)

    assert f"failed    {UNIQUE}: " in out.getvalue()
    assert f"invalid   {UNIQUE}" in out.getvalue()


def test_hopper_indexes__leaves_a_skipped_index_invalid_and_says_so(pg: BaseEngine) -> None:
    make_duplicates(pg)
    invalid_unique_index()

    out = indexes("--skip-repair", UNIQUE)

    assert out == f"invalid   {UNIQUE}\n"
    assert valid(UNIQUE) is False


def test_history_indexer__skips_a_failed_repair_until_its_retry_is_due(pg: BaseEngine) -> None:
    make_duplicates(pg)
    invalid_unique_index()
    indexer = HistoryIndexer(pg)

    with pytest.raises(HistoryIndexRepairError):
        indexer.build()
    again = indexer.build()  # within repair_retry: not rebuilt in vain

    assert again.repair_errors == {}
    assert UNIQUE in again.invalid
    indexer.repair_retry = dt.timedelta(0)
    with pytest.raises(HistoryIndexRepairError):
        indexer.build()
