"""Pass leases with real worker processes killed with SIGKILL: before BEGIN (no
attempt charged), during a pass and after its commit (the next claim takes the run
over, charged once, no committed step or count repeated), and a hung pass whose
lease expires while its worker lives."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.rules import PASS_LEASE_EXPIRED_ERROR
from django_hopper.models import JobStep
from django_hopper.types import RescueReason
from tests.support.runtime import FINAL, Processes, wait_for
from tests.testapp.models import Effect
from tests.testapp.resumable_jobs import rs_crash

pytestmark = pytest.mark.processes

#: The workers import the resumable jobs at start, as a deployment lists them in IMPORTS.
IMPORTS = {"IMPORTS": ["tests.testapp.jobs", "tests.testapp.resumable_jobs"]}


def held_worker(
    processes: Processes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, point: str, *args: str
) -> subprocess.Popen[bytes]:
    """Start a worker that holds its first rs_crash attempt at ``point``."""
    monkeypatch.setenv("HOPPER_TEST_HOLD", point)
    monkeypatch.setenv("HOPPER_TEST_MARKS", str(tmp_path))
    try:
        return processes.start("--queues", "default:2", *args, overrides=IMPORTS)
    finally:
        monkeypatch.delenv("HOPPER_TEST_HOLD")


def kill_at(proc: subprocess.Popen[bytes], tmp_path: Path, point: str, job_id: Any) -> None:
    """Wait until the worker holds at ``point`` for the job, then SIGKILL it."""
    wait_for(lambda: (tmp_path / f"{point}-{job_id}").exists(), timeout=60)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def finished(processes: Processes, handle: Any) -> Any:
    job = wait_for(lambda: (j := handle.refresh()).state in FINAL and j, timeout=90)
    assert job.state == "completed", processes.logs()
    return job


def notes(job_id: Any) -> Counter[str]:
    return Counter(Effect.objects.filter(job_id=job_id).values_list("note", flat=True))


def test_worker_killed_before_begin__the_run_is_not_charged_an_attempt(
    tx_engine: BaseEngine, processes: Processes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    handle = rs_crash.start(pages=1, instance="before-begin")
    first = held_worker(processes, monkeypatch, tmp_path, "before_begin")
    kill_at(first, tmp_path, "before_begin", handle.id)
    assert handle.refresh().state == "running"  # the dead worker's claim, never begun

    # A live leader rescues the claim once the dead worker's lease expires.
    processes.start("--queues", "default:2", overrides=IMPORTS)

    job = finished(processes, handle)
    assert job.errors == [], job.errors  # the miss cost no attempt and left no error
    assert job.attempt == 1
    assert notes(handle.id) == Counter({"p0-a": 1, "p0-b": 1})
    assert "admission miss 1" in processes.logs()


def test_worker_killed_during_a_pass__the_next_claim_takes_over_without_a_leader(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    handle = rs_crash.start(pages=2, hang=60.0, instance="mid-pass")
    first = processes.start("--queues", "default:2", "--no-maintenance", overrides=IMPORTS)
    wait_for(
        lambda: JobStep.objects.filter(job_id=handle.id, step="a", result__isnull=False).exists(),
        timeout=60,
    )
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)

    # No leader anywhere: only the next claim can take the run over.
    processes.start("--queues", "default:2", "--no-maintenance", overrides=IMPORTS)

    job = finished(processes, handle)
    assert [e.rescue for e in job.errors] == [RescueReason.LEASE_EXPIRED], job.errors
    assert job.errors[0].error == PASS_LEASE_EXPIRED_ERROR
    # Step a was memoized under the dead pass; b of page 0 never finished there.
    assert notes(handle.id) == Counter({"p0-a": 1, "p0-b": 1, "p1-a": 1, "p1-b": 1})
    assert job.output == {"cursor": 1, "counters": {"pages": 2}}


def test_worker_killed_after_commit__the_next_pass_resumes_from_the_committed_cursor(
    tx_engine: BaseEngine, processes: Processes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    handle = rs_crash.start(pages=2, instance="after-commit")
    first = held_worker(processes, monkeypatch, tmp_path, "after_commit", "--no-maintenance")
    kill_at(first, tmp_path, "after_commit", handle.id)
    committed = handle.refresh()
    assert committed.state == "running" and committed.progress is not None
    assert committed.progress.cursor["cursor"] == 1  # page 0 committed, its result unwritten

    processes.start("--queues", "default:2", "--no-maintenance", overrides=IMPORTS)

    job = finished(processes, handle)
    assert [e.rescue for e in job.errors] == [RescueReason.LEASE_EXPIRED], job.errors
    assert notes(handle.id) == Counter({"p0-a": 1, "p0-b": 1, "p1-a": 1, "p1-b": 1})
    assert job.output == {"cursor": 1, "counters": {"pages": 2}}  # no page counted twice


def test_hung_pass__is_taken_over_once_its_lease_expires_while_its_worker_lives(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    handle = rs_crash.start(pages=1, hang=8.0, instance="hung")
    hung = processes.start("--queues", "default:1", "--no-maintenance", overrides=IMPORTS)
    wait_for(
        lambda: JobStep.objects.filter(job_id=handle.id, step="a", result__isnull=False).exists(),
        timeout=60,
    )
    # The hung worker stays alive and keeps renewing its own client lease; its pass
    # stopped renewing the 2 s pass lease inside step b.
    processes.start("--queues", "default:1", "--no-maintenance", overrides=IMPORTS)

    job = finished(processes, handle)
    assert hung.poll() is None  # taken over while the holder still lived
    assert [e.rescue for e in job.errors] == [RescueReason.LEASE_EXPIRED], job.errors
    assert notes(handle.id)["p0-a"] == 1
