"""The worker's console lines at each verbosity, as a real ``hopper_worker`` prints them."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
from django.test import override_settings

from django_hopper.engine.base import BaseEngine
from django_hopper.observability import console
from tests.support.runtime import Processes, insert
from tests.testapp import jobs

pytestmark = pytest.mark.processes


def run_burst(
    processes: Processes, tx_engine: BaseEngine, *args: str, overrides: dict | None = None
) -> str:
    """Insert a job that completes, one that fails and retries, one that is discarded;
    run ``hopper_worker --burst`` over them and return what it printed."""
    insert(tx_engine, jobs.add, 1, 2)
    insert(tx_engine, jobs.fail.using(max_attempts=2), "flaky")
    insert(tx_engine, jobs.fail.using(max_attempts=1), "hopeless")
    proc = processes.start("--burst", "--queues", "default:2", *args, overrides=overrides)
    assert proc.wait(timeout=60) == 0, processes.logs()
    return processes.logs()


@pytest.fixture
def own_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes run with a LOGGING that does not configure django_hopper."""
    monkeypatch.setenv("HOPPER_TEST_NO_LOGGING", "1")


def test_console__default_verbosity_prints_start_failures_and_stop(
    tx_engine, processes, own_console
):
    out = run_burst(processes, tx_engine)
    assert "INFO hopper 0.1.0.dev0 worker started: client " in out
    assert "queues default:2 (2 slots), 1 process" in out
    assert "takes part in leader election" in out
    # ", in 0.001s" when the process times attempts (tracing or metrics are on).
    assert re.search(
        r"failed: RuntimeError: flaky \(attempt 1 of 2(, in [\d.]+s)?\); will retry", out
    )
    assert "ERROR job tests.testapp.jobs.fail " in out
    assert re.search(
        r"failed: RuntimeError: hopeless \(attempt 1 of 1(, in [\d.]+s)?\); discarded", out
    )
    assert "hopper worker stopped: client " in out
    assert "1 completed" in out
    # The flaky job's second attempt may run in the burst too (its backoff is short).
    assert re.search(r"[12] discarded", out)
    assert " started (attempt" not in out  # per-job lines need -v 2
    assert " completed in " not in out
    assert "Traceback" not in out


def test_console__verbosity_2_adds_started_and_finished_lines_and_tracebacks(
    tx_engine, processes, own_console
):
    out = run_burst(processes, tx_engine, "-v", "2")
    assert "DEBUG job tests.testapp.jobs.add " in out
    assert " started (attempt 1 of 25, queue default)" in out
    assert " completed in " in out
    assert "Traceback (most recent call last)" in out
    assert "RuntimeError: hopeless" in out


def test_console__verbosity_0_prints_errors_only(tx_engine, processes, own_console):
    out = run_burst(processes, tx_engine, "-v", "0")
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert lines, out
    assert all(" ERROR " in line for line in lines), out
    assert any(re.search(r"hopeless \(attempt 1 of 1.*\); discarded", line) for line in lines)


def test_console__json_format_prints_one_parsable_object_per_line(
    tx_engine, processes, own_console
):
    out = run_burst(processes, tx_engine, "--log-format", "json")
    records = [json.loads(line) for line in out.splitlines() if not line.startswith("---")]
    events = {r.get("event") for r in records}
    assert {"worker_started", "finished", "worker_stopped"} <= events
    start = next(r for r in records if r.get("event") == "worker_started")
    assert start["queues"] == {"default": 2} and start["leader_election"] is True
    discarded = next(r for r in records if r.get("state") == "discarded")
    assert discarded["level"] == "ERROR"
    assert discarded["kind"] == "tests.testapp.jobs.fail"
    assert discarded["attempt"] == 1 and discarded["error"] == "RuntimeError: hopeless"
    stop = next(r for r in records if r.get("event") == "worker_stopped")
    assert stop["completed"] == 1 and stop["discarded"] in (1, 2)


def test_console__project_logging_that_configures_hopper_is_kept(tx_engine, processes):
    # tests.settings.LOGGING configures django_hopper: a StreamHandler at WARNING
    # with the default "%(message)s" format.
    out = run_burst(processes, tx_engine, "-v", "2")
    assert "worker started" not in out  # INFO: below the project's level
    assert "\njob tests.testapp.jobs.fail " in out  # the project's format, no time stamp
    assert "] WARNING " not in out


def test_console__system_checks_print_once_with_several_processes(
    tx_engine, processes, own_console
):
    # RESCUE_STUCK_AFTER not longer than JOB_TIMEOUT: check hopper.W002 warns.
    out = run_burst(
        processes,
        tx_engine,
        "--processes",
        "2",
        overrides={"RESCUE_STUCK_AFTER": 1.0, "JOB_TIMEOUT": 2.0},
    )
    assert out.count("hopper.W002") == 1, out
    assert out.count("worker started") == 2
    assert "one of 2 processes" in out


def test_install_handler__not_installed_when_logging_configures_hopper():
    with override_settings(
        LOGGING={"version": 1, "loggers": {"django_hopper.job": {"level": "INFO"}}}
    ):
        assert console.install_handler(1) is None


def test_install_handler__installed_once_when_logging_leaves_hopper_alone():
    hopper = logging.getLogger("django_hopper")
    saved = (hopper.handlers[:], hopper.level, hopper.propagate)
    hopper.handlers = []
    stream = io.StringIO()
    try:
        with override_settings(LOGGING={"version": 1, "disable_existing_loggers": False}):
            first = console.install_handler(1, "json", stream=stream)
            handler = console.install_handler(1, "json", stream=stream)
            # Asserted inside the block: Django 6 re-applies the settings' LOGGING
            # when override_settings restores it, replacing hopper's handlers.
            assert handler is not None and first not in hopper.handlers
            assert hopper.handlers == [handler]
            logging.getLogger("django_hopper.job").warning("hello", extra={"job_id": "x"})
        record = json.loads(stream.getvalue().splitlines()[-1])
        assert record["message"] == "hello" and record["job_id"] == "x"
    finally:
        console._uninstall()
        hopper.handlers, hopper.level, hopper.propagate = saved
        logging.getLogger("django_hopper.job").setLevel(logging.NOTSET)
