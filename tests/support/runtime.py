"""Helpers shared by the test folders: inserting jobs, waiting, worker processes.

Imported by tests and conftest files alike (never import another folder's
conftest.py); the ``make_worker`` and ``processes`` fixtures are registered by
the conftest files that import them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobInsertOpts, JobInsertParams
from django_hopper.types import FINAL_STATES, JobRow
from django_hopper.worker import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
FINAL = FINAL_STATES


def insert(engine: BaseEngine, fn: Any, *args: Any, **kwargs: Any) -> JobRow:
    """Insert one job of a ``@job`` function through the engine (committed in tx tests)."""
    return insert_many(engine, fn, [(args, kwargs)])[0]


def insert_many(
    engine: BaseEngine, fn: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
) -> list[JobRow]:
    """Insert many jobs of one function, with notifications, in one statement."""
    params = [fn.insert_params(a, k) for a, k in calls]
    return [r.job for r in engine.job_insert_many(params, JobInsertOpts(notify=True))]


def insert_kind(engine: BaseEngine, kind: str, **fields: Any) -> JobRow:
    """Insert a job of an arbitrary kind (e.g. one no worker knows)."""
    params = JobInsertParams(kind=kind, args={"args": [], "kwargs": {}}, **fields)
    return engine.job_insert_many([params])[0].job


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, step: float = 0.02) -> Any:
    """Poll until ``predicate()`` is truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(step)


def get(engine: BaseEngine, job: JobRow) -> JobRow:
    """Re-read a job (live or history)."""
    row = engine.job_get(job.id)
    assert row is not None, f"job {job.id} vanished"
    return row


@pytest.fixture
def make_worker(tx_engine: BaseEngine) -> Iterator[Callable[..., Worker]]:
    """Build in-process workers (set up, not looping) that are shut down after the test."""
    workers: list[Worker] = []

    def make(**config: Any) -> Worker:
        config.setdefault("queues", {"default": 4})
        config.setdefault("maintenance", False)
        config.setdefault("shutdown_timeout", 5.0)
        worker = Worker(WorkerConfig(**config), tx_engine)
        worker.setup()
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.shutdown()


# ---------------------------------------------------------------------------
# Worker processes

#: Short leases and intervals so that crashes are noticed within a second or two.
FAST = {
    "CLIENT_TTL": 1.5,
    "HEARTBEAT_INTERVAL": 0.3,
    "LEADER_TTL": 1.5,
    "MAINTENANCE_INTERVAL": 0.2,
    "POLL_INTERVAL": 0.1,
    "BACKOFF_BASE": 0.05,
    "BACKOFF_EXPONENT": 1.0,
    "BACKOFF_MAX": 0.5,
    "RESCUE_STUCK_AFTER": 0,
    "SHUTDOWN_TIMEOUT": 5.0,
}


class Processes:
    """Worker processes of one test, killed at teardown whatever happened."""

    def __init__(self, db_name: str, tmp: Path) -> None:
        self.db_name = db_name
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def env(self, overrides: dict[str, Any] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "HOPPER_TEST_DATABASE": os.environ.get("HOPPER_TEST_DATABASE", "sqlite"),
                "HOPPER_TEST_DB_NAME": self.db_name,
                "HOPPER_TEST_OVERRIDES": json.dumps({**FAST, **(overrides or {})}),
                "PYTHONPATH": str(ROOT),
            }
        )
        return env

    def start(
        self, *args: str, command: str = "hopper_worker", overrides: dict[str, Any] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``python -m django <command> <args>``; output goes to a log file."""
        self.count += 1
        log = open(self.tmp / f"{command}-{self.count}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", command, *args],
            cwd=ROOT,
            env=self.env(overrides),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        """Return every process's output (for failure messages)."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def processes(tx_engine: BaseEngine, tmp_path: Path) -> Iterator[Processes]:
    """Start worker processes on the test database; they are killed before teardown."""
    from django.db import connection

    procs = Processes(str(connection.settings_dict["NAME"]), tmp_path)
    yield procs
    procs.kill_all()


def db_time_shift(engine: BaseEngine, seconds: float) -> dt.datetime:
    """Return the database clock shifted by ``seconds`` (for injecting ``now``)."""
    return engine.now() + dt.timedelta(seconds=seconds)
