"""Claims ahead of the free slots with real worker processes: a worker killed while it
holds buffered jobs loses none and is charged no attempt for them (each is an
admission miss); a worker stopped by SIGTERM gives its buffer back unstarted."""

from __future__ import annotations

import random
import signal
import time
from collections import defaultdict

import pytest

from django_hopper.engine.params import JobListParams
from django_hopper.engine.rules import AHEAD_MISS_REASON
from django_hopper.models import Client, Job
from tests.support.runtime import FINAL, get, insert_many, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.processes


def all_jobs(engine):
    return engine.job_list(JobListParams(limit=10_000))


def held_ahead() -> dict[int, set]:
    """Return the running jobs marked claimed ahead, by the client holding them."""
    held: dict[int, set] = defaultdict(set)
    rows = Job.objects.filter(state="running", claimed_ahead_at__isnull=False)
    for job_id, client in rows.values_list("id", "attempted_by"):
        held[client].add(job_id)
    return held


def test_workers_killed_holding_buffered_jobs_lose_none_and_are_charged_no_attempt(
    tx_engine, processes
):
    rng = random.Random(17)
    total = 8000
    added = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(total)])
    workers = [processes.start("--queues", "default:4") for _ in range(3)]
    lost: dict = {}  # job -> the killed worker's client that held it claimed ahead
    missed: set = set()
    kills = 0
    deadline = time.monotonic() + 60
    while kills < 3 and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.05, 0.2))
        pids = {c.id: int(c.info.get("pid", 0)) for c in tx_engine.client_list()}
        for client, ids in held_ahead().items():
            victim = next((i for i, w in enumerate(workers) if w.pid == pids.get(client)), None)
            if victim is None:
                continue
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(5)
            workers[victim] = processes.start("--queues", "default:4")
            lost.update(dict.fromkeys(ids, client))
            kills += 1
            break
        missed |= set(Job.objects.filter(admission_misses__gte=1).values_list("id", flat=True))
    assert kills >= 2, processes.logs()

    end = time.monotonic() + 120
    while time.monotonic() < end:
        missed |= set(Job.objects.filter(admission_misses__gte=1).values_list("id", flat=True))
        if not Job.objects.exclude(state__in=FINAL).exists():
            break
        time.sleep(0.05)
    rows = {r.id: r for r in all_jobs(tx_engine)}
    assert len(rows) == total
    assert {r.state for r in rows.values()} == {"completed"}, processes.logs()
    # Each job completed once, with its own output.
    assert [rows[j.id].output for j in added] == [i + 1 for i in range(total)]
    for row in rows.values():
        # A charged attempt that did not complete left one error; a miss left none.
        assert len(row.errors) == row.attempt - 1, (row.attempt, [e.error for e in row.errors])
        if row.id in lost:
            # The claim the killed worker held ahead was never charged.
            assert not any(e.by == lost[row.id] for e in row.errors), row.errors
    # The buffered jobs of the killed workers were rescued as admission misses.
    assert missed & set(lost), "no job held ahead was counted as an admission miss"


def test_sigterm_gives_the_buffered_jobs_back_with_their_attempts(tx_engine, processes):
    fast = insert_many(tx_engine, jobs.add, [((i, 0), {}) for i in range(40)])
    proc = processes.start("--queues", "default:2")
    wait_for(lambda: all(get(tx_engine, j).state == "completed" for j in fast), timeout=30)
    # The queue's jobs proved short: one claim takes the four (committed together)
    # two into the slots, two ahead; the stop comes once both wait in the buffer.
    held = insert_many(tx_engine, jobs.rt_hold, [((2.0,), {}) for _ in range(4)])
    wait_for(lambda: sum(map(len, held_ahead().values())) == 2, timeout=20, step=0.005)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, processes.logs()

    rows = [get(tx_engine, j) for j in held]
    started = [r for r in rows if r.state == "completed"]
    returned = [r for r in rows if r.state != "completed"]
    assert len(started) == 2 and len(returned) == 2, [(r.state, r.attempt) for r in rows]
    for row in returned:
        assert (row.state, row.attempt, row.fence, row.errors) == ("available", 0, 1, [])
        live = Job.objects.get(id=row.id)
        assert live.claimed_ahead_at is None and live.admission_misses is None
        assert not (row.snooze_reason or "").startswith(AHEAD_MISS_REASON)
    assert not Client.objects.exists()
