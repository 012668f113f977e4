"""A real worker process killed mid-pass: the run resumes, committed steps never repeat."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.models import Job, JobStep
from tests.support.runtime import FINAL, Processes, wait_for
from tests.testapp.models import Effect
from tests.testapp.resumable_jobs import rs_dies, rs_pages

pytestmark = pytest.mark.processes


def test_worker_killed_mid_pass_resumes_without_repeating_recorded_steps(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    handle = rs_pages.start(pages=3, hold=30.0, instance="kill")
    first = processes.start("--queues", "default:2")

    # Page 1's steps a and b are recorded; step c holds on its first try.
    wait_for(
        lambda: (
            JobStep.objects.filter(job_id=handle.id, step="b", result__isnull=False).exists()
            and Effect.objects.filter(job_id=handle.id, note="p1-b").exists()
        ),
        timeout=30,
    )
    time.sleep(0.3)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    processes.start("--queues", "default:2")

    job = wait_for(lambda: (j := handle.refresh()).state in FINAL and j, timeout=60)
    assert job.state == "completed", processes.logs()
    assert job.output == {"cursor": 2, "counters": {"pages": 3}}
    notes = Counter(Effect.objects.filter(job_id=handle.id).values_list("note", flat=True))
    # Every step ran exactly once: the killed pass's a and b were memoized, and its c
    # never finished (so it ran once, in the pass that took over).
    assert notes == Counter({f"p{p}-{s}": 1 for p in range(3) for s in "abc"}), notes
    assert any(e.rescue for e in job.errors), job.errors


def test_worker_refuses_a_run_whose_progress_a_pass_did_not_commit(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    handle = rs_pages.start(pages=3, instance="foreign")
    Job.objects.filter(id=handle.id).update(
        progress={"step": "import", "cursor": 4200, "at": None}, max_attempts=1
    )

    proc = processes.start("--burst", "--queues", "default:1")
    assert proc.wait(60) == 0, processes.logs()

    job = wait_for(lambda: (j := handle.refresh()).state in FINAL and j, timeout=60)
    assert job.state == "discarded", processes.logs()
    assert all("is not a committed pass of a resumable run" in e.error for e in job.errors)
    assert not Effect.objects.filter(job_id=handle.id).exists()  # no step ran: no restart
    assert job.progress is not None and job.progress.cursor == 4200


def test_cron_only_maintenance_recovers_a_driven_pass_whose_process_died(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    """No long-running leader: each cron run of hopper_maintain --once is a client that
    starts after the dead pass's last renewal, and must still expire its lease."""
    handle = rs_dies.start(instance="cron")
    code = (
        "import os; os.environ['HOPPER_TEST_DIE'] = '1'\n"
        "from tests.testapp.resumable_jobs import rs_dies\n"
        f"rs_dies.drive('{handle.id}')\n"
    )
    driver = processes.start("-c", code, command="shell")
    assert driver.wait(60) == 9, processes.logs()
    assert handle.refresh().state == "running"  # the pass died holding its lease

    def cron_run() -> bool:
        proc = processes.start("--once", command="hopper_maintain")
        assert proc.wait(60) in (0, 3), processes.logs()
        return handle.refresh().state != "running"

    assert wait_for(cron_run, timeout=60, step=0.2), processes.logs()
    job = handle.refresh()
    assert job.state in ("retryable", "available")  # due at once: the pass may promote it
    assert job.errors[-1].rescue == "lease_expired"

    assert rs_dies.drive(handle.id) == "done"  # the next pass takes over
    notes = sorted(Effect.objects.filter(job_id=handle.id).values_list("note", flat=True))
    assert notes == ["a", "b"]  # step a was memoized under the dead pass's lease
