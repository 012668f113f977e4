"""Queue controls under real contention: 3 worker processes x 20 threads each.

The test process samples the live table continuously while the workers run,
so a limit broken for even one sample fails the test.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import time
from collections import Counter
from collections.abc import Callable

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobInsertOpts, JobInsertParams
from django_hopper.models import Job, JobHistory
from django_hopper.queues import pause_queue, resume_queue, set_queue_limits
from tests.support.runtime import Processes
from tests.support.runtime import processes as processes
from tests.testapp import jobs

pytestmark = pytest.mark.processes

Q = "controlled"


def hold_params(n: int, seconds: float, **fields: object) -> list[JobInsertParams]:
    base = jobs.rt_hold.insert_params((), {"seconds": seconds})
    return [dataclasses.replace(base, queue=Q, **fields) for _ in range(n)]  # type: ignore[arg-type]


def insert(engine: BaseEngine, params: list[JobInsertParams]) -> None:
    engine.job_insert_many(params, JobInsertOpts(notify=True))


def start_workers(processes: Processes, n: int = 3, threads: int = 20) -> None:
    for _ in range(n):
        processes.start("--queues", f"{Q}:{threads}")


def claimed() -> int:
    """Jobs of the queue that have been claimed: running, waiting again, or finished."""
    live = Job.objects.filter(queue=Q).exclude(state="available").count()
    return live + JobHistory.objects.filter(queue=Q).count()


def sample_until_done(
    total: int, procs: Processes, timeout: float, check: Callable[[list[tuple]], None]
) -> None:
    """Call ``check`` with the running jobs (partition, ordering key) until all finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check(
            list(
                Job.objects.filter(queue=Q, state="running").values_list(
                    "partition_key", "ordering_key"
                )
            )
        )
        if JobHistory.objects.filter(queue=Q).count() >= total:
            return
        time.sleep(0.005)
    pytest.fail(f"not all {total} jobs finished\n{procs.logs()}")


def test_global_limit__never_more_than_3_running_across_3_workers(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    set_queue_limits(Q, global_limit=3)
    insert(tx_engine, hold_params(30, 0.05))
    peak = [0]

    def check(running: list[tuple]) -> None:
        assert len(running) <= 3, running
        peak[0] = max(peak[0], len(running))

    start_workers(processes)
    sample_until_done(30, processes, 60, check)
    assert peak[0] >= 2  # the limit, not a lack of work, held it


def test_partition_limit__never_two_of_one_partition_at_once(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    set_queue_limits(Q, partition_limit=1)
    for p in "abc":
        insert(tx_engine, hold_params(8, 0.05, partition_key=p))

    def check(running: list[tuple]) -> None:
        per = Counter(p for p, _ in running)
        assert max(per.values(), default=0) <= 1, per

    start_workers(processes)
    sample_until_done(24, processes, 60, check)


def test_ordering_key__never_two_running_and_runs_in_id_order(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    insert(tx_engine, hold_params(15, 0.02, ordering_key="k"))
    insert(tx_engine, hold_params(15, 0.02, ordering_key="m"))
    insert(tx_engine, hold_params(10, 0.02))

    def check(running: list[tuple]) -> None:
        per = Counter(k for _, k in running if k is not None)
        assert max(per.values(), default=0) <= 1, per

    start_workers(processes)
    sample_until_done(40, processes, 60, check)
    for key in ("k", "m"):
        rows = list(JobHistory.objects.filter(queue=Q, ordering_key=key).order_by("attempted_at"))
        assert [r.id for r in rows] == sorted(r.id for r in rows)
        # PostgreSQL's now() is its transaction's start, a millisecond or two before
        # the statement; each job runs 20 ms, so a real overlap is far larger.
        slack = dt.timedelta(milliseconds=10)
        for before, after in itertools.pairwise(rows):
            assert before.finalized_at <= after.attempted_at + slack


def _rate(processes: Processes, tx_engine: BaseEngine, rate: float, seconds: float) -> None:
    burst = int(rate)
    set_queue_limits(Q, rate_per_sec=rate, burst=burst)
    insert(tx_engine, hold_params(int(rate * seconds * 2 + 100), 0.0))
    start_workers(processes)
    deadline = time.monotonic() + 30
    while claimed() == 0:
        assert time.monotonic() < deadline, processes.logs()
        time.sleep(0.01)
    time.sleep(seconds)
    n = claimed()
    # The bucket starts full: burst + rate * seconds, give or take a burst.
    assert abs(n - (rate * seconds + burst)) <= burst, n


def test_rate_limit__20_per_second_over_10_seconds_claims_200_give_or_take_a_burst(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    _rate(processes, tx_engine, 20.0, 10.0)


def test_pause__stops_claims_within_a_second_and_resume_restarts_them(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    insert(tx_engine, hold_params(2000, 0.01))
    start_workers(processes, n=2, threads=4)
    deadline = time.monotonic() + 30
    while claimed() < 20:
        assert time.monotonic() < deadline, processes.logs()
        time.sleep(0.02)

    pause_queue(Q)
    # PostgreSQL: the control notification; SQLite: the next renewal (0.3 s here).
    time.sleep(1.0)
    settled = claimed()
    time.sleep(1.0)
    assert claimed() == settled

    resume_queue(Q)
    deadline = time.monotonic() + 2.0
    while claimed() == settled:
        assert time.monotonic() < deadline, "claims did not restart after resume"
        time.sleep(0.02)
