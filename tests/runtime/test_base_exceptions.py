"""A job that raises a BaseException which is not a shutdown signal (KeyboardInterrupt,
GeneratorExit, SystemExit, a custom one) fails its own attempt and nothing else:
real worker processes keep working, burst runs end, and real signals still stop them."""

from __future__ import annotations

import signal

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.models import Client
from django_hopper.types import JobRow
from tests.support.runtime import Processes, get, insert, insert_many, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.processes

RAISED = ["KeyboardInterrupt", "GeneratorExit", "SystemExit", "JobHalt"]


def assert_discarded_with(engine: BaseEngine, job: JobRow, which: str, attempts: int = 1) -> None:
    """The job ended discarded after ``attempts`` attempts, each recording ``which``."""
    row = get(engine, job)
    assert row.state == "discarded", (which, row.state)
    assert len(row.errors) == attempts
    for err in row.errors:
        assert err.error == f"{which}: raised by the job"
        assert f"{which}: raised by the job" in err.trace


def run_burst(processes: Processes, *args: str) -> None:
    proc = processes.start("--burst", *args)
    try:
        code = proc.wait(120)
    except Exception:  # pragma: no cover - the failure message needs the logs
        pytest.fail(f"the burst worker did not exit\n{processes.logs()}")
    assert code == 0, processes.logs()


@pytest.mark.parametrize(
    "fn", [jobs.rt_raise_base, jobs.rt_async_raise_base], ids=["sync", "async"]
)
def test_burst_worker__fails_attempts_raising_base_exceptions_and_runs_the_rest(
    tx_engine: BaseEngine, processes: Processes, fn: object
) -> None:
    raising = insert_many(tx_engine, fn, [((which,), {}) for which in RAISED])
    after = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(3)])
    run_burst(processes, "--queues", "default:1")
    for job, which in zip(raising, RAISED, strict=True):
        assert_discarded_with(tx_engine, job, which)
    assert [get(tx_engine, j).output for j in after] == [1, 2, 3]


def test_burst_worker__survives_a_keyboard_interrupt_in_a_child_task_of_an_async_job(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    # asyncio re-raises a task's KeyboardInterrupt out of the event loop itself.
    raising = insert(tx_engine, jobs.rt_async_raise_base, "KeyboardInterrupt", in_child_task=True)
    later = [insert(tx_engine, jobs.async_add, i, 1) for i in range(2)]
    run_burst(processes, "--queues", "default:1")
    assert_discarded_with(tx_engine, raising, "KeyboardInterrupt")
    assert [get(tx_engine, j).output for j in later] == [1, 2]


def test_supervised_burst_workers__fail_attempts_raising_base_exceptions(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    sync = insert_many(tx_engine, jobs.rt_raise_base, [((w,), {}) for w in RAISED])
    async_ = insert_many(tx_engine, jobs.rt_async_raise_base, [((w,), {}) for w in RAISED])
    after = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(4)])
    run_burst(processes, "--processes", "2", "--queues", "default:1")
    for job, which in [*zip(sync, RAISED, strict=True), *zip(async_, RAISED, strict=True)]:
        assert_discarded_with(tx_engine, job, which)
    assert [get(tx_engine, j).output for j in after] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("fn", "signum"),
    [
        (jobs.rt_raise_base_twice, signal.SIGTERM),
        (jobs.rt_async_raise_base_twice, signal.SIGINT),
    ],
    ids=["sync-sigterm", "async-sigint"],
)
def test_worker__retries_attempts_raising_base_exceptions_and_still_stops_on_a_signal(
    tx_engine: BaseEngine, processes: Processes, fn: object, signum: int
) -> None:
    proc = processes.start("--queues", "default:1")
    wait_for(Client.objects.exists, timeout=60)  # started (slow on a loaded machine)
    raising = insert_many(tx_engine, fn, [((which,), {}) for which in RAISED])
    for job, which in zip(raising, RAISED, strict=True):
        wait_for(lambda job=job: get(tx_engine, job).state == "discarded", timeout=30)
        assert_discarded_with(tx_engine, job, which, attempts=2)
    after = insert(tx_engine, jobs.add, 2, 3)
    wait_for(lambda: get(tx_engine, after).state == "completed", timeout=30)
    held = insert(tx_engine, jobs.rt_hold, 0.5)
    wait_for(lambda: get(tx_engine, held).state == "running", timeout=30)
    proc.send_signal(signum)
    assert proc.wait(15) == 0, processes.logs()
    assert get(tx_engine, held).state == "completed"  # the graceful stop let it finish
