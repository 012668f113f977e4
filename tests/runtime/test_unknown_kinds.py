"""A rolling deploy with real worker processes: a job of a kind the running release
does not have is given back (snoozed), not failed, until a worker that has it runs it,
or until ``UNKNOWN_KIND_GRACE`` says no worker will.

The new release's code is a module written to a directory only the new release's
workers have on their path, as a deploy ships a new file: the previous release's
worker cannot import it, whatever it tries.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.models import Client
from django_hopper.types import JobRow
from tests.support.runtime import Processes, get, insert_kind, wait_for

pytestmark = pytest.mark.processes

#: The kind only the new release has.
KIND = "hopper_new_release_jobs.shout"

NEW_RELEASE = """
from django_hopper import job


@job
def shout() -> str:
    return "ran on the new release"
"""


class Release(Processes):
    """Worker processes of one release: the test's code, plus the release's own path."""

    def __init__(self, db_name: str, tmp: Path, path: Path | None = None) -> None:
        tmp.mkdir()
        super().__init__(db_name, tmp)
        self.path = path

    def env(self, overrides: dict[str, Any] | None = None) -> dict[str, str]:
        env = super().env(overrides)
        if self.path is not None:
            env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{self.path}"
        return env


@pytest.fixture
def releases(tx_engine: BaseEngine, tmp_path: Path) -> Any:
    """The previous and the new release's workers; every process is killed at teardown."""
    from django.db import connection

    code = tmp_path / "new_release_code"
    code.mkdir()
    (code / "hopper_new_release_jobs.py").write_text(NEW_RELEASE)
    name = str(connection.settings_dict["NAME"])
    old, new = Release(name, tmp_path / "old"), Release(name, tmp_path / "new", code)
    yield old, new
    old.kill_all()
    new.kill_all()


def snoozed(engine: BaseEngine, job: JobRow) -> JobRow | None:
    """Return the job if a worker gave it back for its unknown kind, else None."""
    row = get(engine, job)
    if row.state == "scheduled" and "unknown job kind" in (row.snooze_reason or ""):
        return row
    return None


def test_worker_process__snoozes_a_kind_of_the_next_release_until_a_worker_of_it_runs_it(
    tx_engine: BaseEngine, releases: tuple[Release, Release]
):
    old, new = releases
    previous = old.start()
    job = insert_kind(tx_engine, KIND)

    first = wait_for(lambda: snoozed(tx_engine, job), timeout=60)
    assert (first.attempt, first.errors) == (0, [])  # given back: it ran nothing
    assert f"unknown job kind '{KIND}'" in (first.snooze_reason or "")
    again = wait_for(  # the previous release tries again and gives it back again
        lambda: (row := snoozed(tx_engine, job)) and row.scheduled_at > first.scheduled_at and row,
        timeout=60,
    )
    assert (again.attempt, again.errors) == (0, [])

    previous.send_signal(signal.SIGTERM)  # the deploy replaces it
    assert previous.wait(timeout=30) == 0, old.logs()
    new.start()

    wait_for(lambda: get(tx_engine, job).state == "completed", timeout=90)
    row = get(tx_engine, job)
    assert (row.output, row.attempt, row.errors) == ("ran on the new release", 1, [])


def test_worker_process__discards_a_kind_no_worker_knows_once_past_the_grace(
    tx_engine: BaseEngine, releases: tuple[Release, Release]
):
    old, _ = releases
    old.start(overrides={"UNKNOWN_KIND_GRACE": 5})
    wait_for(lambda: Client.objects.exists(), timeout=60)  # up: it claims at once
    job = insert_kind(tx_engine, KIND)

    assert wait_for(lambda: snoozed(tx_engine, job), timeout=60).attempt == 0
    wait_for(lambda: get(tx_engine, job).state == "discarded", timeout=60)
    row = get(tx_engine, job)
    assert row.attempt == 1 < row.max_attempts  # discarded, not retried
    (error,) = row.errors
    assert f"unknown job kind '{KIND}'" in error.error
    assert "no worker that claimed it knew the kind within 5s of enqueue" in error.error
