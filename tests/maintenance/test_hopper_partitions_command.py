"""``manage.py hopper_partitions``: listing, --dry-run, and the SQLite message."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator

import pytest
from django.core.management import call_command

from django_hopper.engine.base import BaseEngine
from django_hopper.models import JobHistory
from tests.factories import HistoryFactory
from tests.maintenance.test_history_retention import drop_day_partitions

DAY = dt.timedelta(days=1)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("hopper_partitions", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def cleanup(engine: BaseEngine) -> Iterator[None]:
    yield
    if engine.features.supports_history_partitions:
        drop_day_partitions()


@pytest.mark.usefixtures("cleanup")
def test_dry_run_changes_nothing(engine: BaseEngine, db_now: dt.datetime) -> None:
    HistoryFactory(now=db_now - 400 * DAY)
    before = [(p.name, p.rows_estimate) for p in engine.history_partitions()]  # type: ignore[attr-defined]
    out = run("--create-ahead", "3", "--drop-expired", "--dry-run")
    assert [(p.name, p.rows_estimate) for p in engine.history_partitions()] == before  # type: ignore[attr-defined]
    assert JobHistory.objects.count() == 1
    if engine.features.supports_history_partitions:
        assert "would create hopper_job_history_p" in out
        assert "would delete 1 expired jobs individually" in out


@pytest.mark.usefixtures("cleanup")
def test_create_ahead_then_list(engine: BaseEngine, db_now: dt.datetime) -> None:
    if not engine.features.supports_history_partitions:
        out = run()
        assert "History partitions are a PostgreSQL feature" in out
        assert "with 0 rows" in out
        return
    created = run("--create-ahead", "1")
    assert created.count("create hopper_job_history_p") == 2
    listing = run()
    assert "hopper_job_history_default" in listing
    today = f"hopper_job_history_p{engine.now():%Y%m%d}"
    assert today in listing
