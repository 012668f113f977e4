"""Fixtures for the Django Tasks backend tests: the TASKS setting and an in-process worker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from tests.tasks_backend import tasks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def tasks_setting(settings: Any) -> Iterator[None]:
    """Run every test under the package's TASKS setting, with a clean call log."""
    settings.TASKS = tasks.TASKS
    tasks.CALLS.clear()
    yield
    tasks.CALLS.clear()


@pytest.fixture
def run_worker(tx_engine: BaseEngine) -> Iterator[Callable[..., int]]:
    """Return a function that works the test queues once, in-process, until idle.

    It runs the real worker (claim, execute, complete) on committed jobs and
    returns how many jobs it claimed; call it again for the next round.
    """
    from django_hopper.worker import Worker, WorkerConfig

    workers: list[Worker] = []

    def run(**config: Any) -> int:
        config.setdefault("queues", {"default": 4, "queue_1": 2, "emails": 2})
        config.setdefault("maintenance", False)
        config.setdefault("shutdown_timeout", 5.0)
        worker = Worker(WorkerConfig(**config), tx_engine)
        workers.append(worker)
        return worker.run_once()

    yield run
    for worker in workers:
        worker.shutdown()


@pytest.fixture
def worker_process(tx_engine: BaseEngine) -> Callable[..., str]:
    """Return a function that runs ``hopper_worker --burst`` in a new process, returning its output.

    The process works the test database under :mod:`tests.tasks_backend.settings`
    (this package's TASKS, the ORM receivers of :mod:`tests.tasks_backend.receivers`,
    the Tasks API's log lines on its output) until the queues are empty. Each
    call is a new process, so a new hopper client: a new worker ID.
    """
    from django.db import connection

    def run(*args: str) -> str:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.tasks_backend.settings",
            "HOPPER_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            "PYTHONPATH": str(ROOT),
        }
        argv = args or ("--no-maintenance", "--queues", "default:2")
        proc = subprocess.run(
            [sys.executable, "-m", "django", "hopper_worker", "--burst", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        return output

    return run
