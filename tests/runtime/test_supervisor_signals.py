"""``hopper_worker --processes N`` under a terminal's Ctrl-C or a process-group kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.models import Client
from tests.support.runtime import ROOT, Processes, get, insert, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.processes

#: Process groups started by a test, killed whole at teardown (orphans included).
GROUPS: list[int] = []


@pytest.fixture(autouse=True)
def kill_groups() -> Iterator[None]:
    yield
    while GROUPS:
        try:
            os.killpg(GROUPS.pop(), signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_supervisor(processes: Processes, *args: str) -> subprocess.Popen[bytes]:
    """Start a supervisor in a process group of its own, as a shell starts a foreground job.

    Signalling that group reaches the supervisor and its children together,
    as Ctrl-C in a terminal (or systemd stopping a cgroup) does.
    """
    log = open(processes.tmp / "supervisor.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "hopper_worker", "--processes", "2", *args],
        cwd=ROOT,
        env=processes.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    processes.procs.append(proc)
    GROUPS.append(proc.pid)
    return proc


def test_one_sigint_to_the_process_group_stops_every_child_gracefully_and_exits_0(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    held = [insert(tx_engine, jobs.rt_hold, 1.0) for _ in range(2)]
    proc = start_supervisor(processes, "--queues", "default:1")
    wait_for(lambda: all(get(tx_engine, j).state == "running" for j in held), timeout=30)
    assert Client.objects.count() == 2

    os.killpg(proc.pid, signal.SIGINT)

    assert proc.wait(20) == 0, processes.logs()
    assert [get(tx_engine, j).state for j in held] == ["completed", "completed"]
    assert not Client.objects.exists(), processes.logs()


def test_a_second_sigint_to_the_process_group_stops_the_children_at_once(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    held = [insert(tx_engine, jobs.rt_hold, 30.0) for _ in range(2)]
    proc = start_supervisor(processes, "--queues", "default:1", "--shutdown-timeout", "30")
    wait_for(lambda: all(get(tx_engine, j).state == "running" for j in held), timeout=30)

    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    assert proc.poll() is None  # the first signal waits for the running jobs
    os.killpg(proc.pid, signal.SIGINT)
    started = time.monotonic()

    proc.wait(10)
    assert time.monotonic() - started < 5, processes.logs()
    assert [get(tx_engine, j).state for j in held] == ["running", "running"]  # for the rescue


def test_a_child_whose_supervisor_was_killed_stops_gracefully(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    proc = start_supervisor(processes, "--queues", "default:1")
    wait_for(lambda: Client.objects.count() == 2, timeout=30)

    proc.send_signal(signal.SIGKILL)  # the supervisor alone: its children are orphaned
    proc.wait(5)

    wait_for(lambda: not Client.objects.exists(), timeout=15)
