"""Races between connections on committed data: threads and OS processes.

Every thread uses its own Django connection (Django's connections are per
thread) and closes it when it ends. Child processes connect to the test
database through ``HOPPER_TEST_DB_NAME``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connection, transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobClaimByIDParams,
    JobFinalize,
    JobFinalizeParams,
    JobInsertParams,
    JobRecordProgressParams,
    LeaderParams,
)
from django_hopper.exceptions import JobLocked
from django_hopper.ids import new_ids
from django_hopper.models import Job
from django_hopper.types import JobRow
from tests.engine_conformance.support import (
    HOUR,
    claim,
    finalize,
    get,
    insert,
    insert_many,
    register,
    result,
    running,
)

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def run_threads(n: int, target: Callable[[int], T], timeout: float = 20.0) -> list[T]:
    """Run ``target(i)`` in ``n`` threads released together; return their results in order."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=timeout)
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


def insert_jobs(engine: BaseEngine, now: dt.datetime, queue: str, n: int) -> set[Any]:
    ids = sorted(new_ids(n))
    insert_many(engine, [JobInsertParams(kind="tests.race", queue=queue, id=i) for i in ids], now)
    return set(ids)


def drain(engine: BaseEngine, client_id: int, now: dt.datetime, queue: str) -> list[Any]:
    """Claim from ``queue`` in small batches until it is empty."""
    claimed: list[Any] = []
    while True:
        jobs = claim(engine, client_id, now, queue=queue, limit=3)
        if not jobs:
            return claimed
        claimed.extend(j.id for j in jobs)


# -- claims --------------------------------------------------------------------------------


def test_claim__threads_claim_every_job_exactly_once(tx_engine: BaseEngine) -> None:
    now = tx_engine.now()
    expected = insert_jobs(tx_engine, now, "race", 90)
    clients = [register(tx_engine, now) for _ in range(6)]

    per_thread = run_threads(6, lambda i: drain(tx_engine, clients[i], now, "race"))

    claimed = [job_id for ids in per_thread for job_id in ids]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert set(claimed) == expected
    for i, ids in enumerate(per_thread):
        for job_id in ids[:3]:
            assert get(tx_engine, job_id).attempted_by == clients[i]


CHILD = """
import datetime as dt, json, sys
import django
django.setup()
from django.db import connection
from django_hopper.engine import get_engine
from django_hopper.engine.base import ClientRegisterParams, JobClaimParams

now = dt.datetime.fromisoformat(sys.argv[1])
queue = sys.argv[2]
engine = get_engine()
client = engine.client_register(
    ClientRegisterParams(hostname="child", ttl=dt.timedelta(hours=1), now=now)
)
print("ready", flush=True)
sys.stdin.readline()
claimed = []
while True:
    jobs = engine.job_claim(JobClaimParams(queue=queue, client_id=client, limit=3, now=now)).jobs
    if not jobs:
        break
    claimed.extend(str(j.id) for j in jobs)
connection.close()
print(json.dumps({"client": client, "claimed": claimed}), flush=True)
"""


def test_claim__processes_claim_every_job_exactly_once(tx_engine: BaseEngine) -> None:
    now = tx_engine.now()
    expected = insert_jobs(tx_engine, now, "proc-race", 60)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "HOPPER_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
    }
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, now.isoformat(), "proc-race"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "ready", child.stderr.read() if child.stderr else line
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=20)
            assert child.returncode == 0, err
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()

    claimed = [job_id for out in outputs for job_id in out["claimed"]]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert {str(i) for i in expected} == set(claimed)
    assert len({out["client"] for out in outputs}) == 3


@contextmanager
def row_held(job: JobRow) -> Iterator[None]:
    """Hold ``job``'s row in another connection's open write transaction
    (a row lock on PostgreSQL, the write lock on SQLite); roll it back on exit."""
    holding = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    class Rollback(Exception):
        pass

    def hold() -> None:
        try:
            with transaction.atomic():
                Job.objects.filter(id=job.id).update(priority=job.priority)
                holding.set()
                release.wait(10)
                raise Rollback
        except Rollback:
            pass
        except BaseException as exc:
            errors.append(exc)
            holding.set()
        finally:
            connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(10), "the holding transaction did not start"
    try:
        assert not errors, errors
        yield
    finally:
        release.set()
        thread.join(10)


def test_claim__skips_jobs_locked_by_another_worker(tx_engine: BaseEngine) -> None:
    if not tx_engine.features.supports_skip_locked:
        pytest.skip("single-writer engines serialize claims instead of skipping rows")
    now = tx_engine.now()
    first, *rest = sorted(insert_jobs(tx_engine, now, "locked", 4))
    client_id = register(tx_engine, now)
    locked = get(tx_engine, first)

    with row_held(locked):
        claimed = [j.id for j in claim(tx_engine, client_id, now, queue="locked", limit=10)]

    assert claimed == rest
    assert get(tx_engine, first).state == "available"


def test_finalize__skip_locked_skips_a_job_held_by_another_transaction(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    job = running(tx_engine, client_id, now)

    with row_held(job):
        applied = finalize(tx_engine, now, result(job, "completed"), skip_locked=True)

    assert applied == []
    assert get(tx_engine, job).state == "running"
    assert finalize(tx_engine, now, result(job, "completed"), skip_locked=True) != []


def test_finalize__skip_locked_does_not_apply_to_a_leased_result(tx_engine: BaseEngine) -> None:
    now = tx_engine.now()
    job = insert(tx_engine, now, queue="by-id")
    leased = tx_engine.job_claim_by_id(JobClaimByIDParams(id=job.id, fence=0, ttl=HOUR, now=now))
    done = JobFinalize(
        id=job.id,
        attempted_by=None,
        fence=leased.lease.fence,
        state="completed",
        lease_token=leased.lease.token,
    )
    applied: list[Any] = []

    def holder_outcome() -> None:
        try:
            applied.extend(
                tx_engine.job_finalize_many(JobFinalizeParams(jobs=[done], skip_locked=True))
            )
        finally:
            connection.close()

    with row_held(leased.job):
        outcome = threading.Thread(target=holder_outcome, daemon=True)
        outcome.start()
        # A skipped result would return at once; a leased one waits for the row.
        outcome.join(0.5)
    outcome.join(20)

    assert not outcome.is_alive()
    assert [f.id for f in applied] == [job.id]
    assert get(tx_engine, job).state == "completed"


def test_progress__no_wait_raises_job_locked_while_another_transaction_holds_the_job(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    job = running(tx_engine, client_id, now)
    params = JobRecordProgressParams(
        id=job.id,
        attempted_by=client_id,
        fence=job.fence,
        attempt=job.attempt,
        step="s",
        no_wait=True,
        now=now,
    )

    with row_held(job), pytest.raises(JobLocked) as info:
        tx_engine.job_record_progress(params)

    assert str(info.value) == f"job {job.id} is locked by another transaction"

    assert get(tx_engine, job).progress is None
    assert tx_engine.job_record_progress(params) is not None


def test_claim_by_id__no_wait_raises_job_locked_while_another_transaction_holds_the_job(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    job = insert(tx_engine, now, queue="by-id")
    params = JobClaimByIDParams(id=job.id, fence=0, ttl=HOUR, now=now, no_wait=True)

    with row_held(job), pytest.raises(JobLocked) as info:
        tx_engine.job_claim_by_id(params)

    assert str(info.value) == f"job {job.id} is locked by another transaction"

    assert (get(tx_engine, job).state, get(tx_engine, job).fence) == ("available", 0)
    assert tx_engine.job_claim_by_id(params).job.state == "running"


def test_claim_by_id__a_refused_no_wait_claim_leaves_the_callers_transaction_usable(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_skip_locked:
        pytest.skip("single-writer engines: a caller's open transaction holds the write lock")
    now = tx_engine.now()
    job = insert(tx_engine, now, queue="by-id")
    other = insert(tx_engine, now, queue="by-id")

    with transaction.atomic():
        with row_held(job), pytest.raises(JobLocked):
            tx_engine.job_claim_by_id(
                JobClaimByIDParams(id=job.id, fence=0, ttl=HOUR, now=now, no_wait=True)
            )
        row = tx_engine.job_claim_by_id(
            JobClaimByIDParams(id=other.id, fence=0, ttl=HOUR, now=now, no_wait=True)
        )

    assert get(tx_engine, other).lease_expires_at == row.expires_at
    assert get(tx_engine, job).state == "available"


# -- inserts and finalizes --------------------------------------------------------------------


def test_insert__concurrent_inserts_of_one_unique_key_agree_on_one_job(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    params = JobInsertParams(kind="tests.unique-race", unique_key="same")

    results = run_threads(8, lambda i: insert_many(tx_engine, [params], now)[0])

    assert sum(not r.duplicate for r in results) == 1
    assert len({r.job.id for r in results}) == 1


def test_finalize__concurrent_results_of_one_claim_apply_at_most_once(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    job = running(tx_engine, client_id, now)
    states = ["completed", "discarded", "retryable", "canceled"]

    applied = run_threads(
        4,
        lambda i: tx_engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[
                    JobFinalize(id=job.id, attempted_by=client_id, fence=job.fence, state=states[i])
                ],
                now=now,
            )
        ),
    )

    assert sum(len(a) for a in applied) == 1
    winner = next(i for i, a in enumerate(applied) if a)
    assert get(tx_engine, job).state == states[winner]


def test_finalize__racing_results_of_a_stale_and_the_current_claim_apply_only_the_current(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    stale = register(tx_engine, now, ttl=HOUR)
    fresh = register(tx_engine, now, ttl=HOUR)
    job = running(tx_engine, stale, now, queue="reclaim")
    finalize(tx_engine, now, result(job, "retryable"))
    (again,) = claim(tx_engine, fresh, now, queue="reclaim")

    results = run_threads(
        2,
        lambda i: finalize(tx_engine, now, result(job if i == 0 else again, "completed")),
    )

    assert results[0] == []
    assert len(results[1]) == 1
    assert get(tx_engine, job).attempted_by == fresh


def test_leader__concurrent_attempts_elect_exactly_one_leader(tx_engine: BaseEngine) -> None:
    now = tx_engine.now()
    clients = [register(tx_engine, now) for _ in range(6)]

    won = run_threads(
        6,
        lambda i: tx_engine.leader_attempt(LeaderParams(client_id=clients[i], ttl=HOUR, now=now)),
    )

    assert sum(won) == 1
    assert tx_engine.leader_get(now=now) == clients[won.index(True)]
