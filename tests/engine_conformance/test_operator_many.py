"""Operator methods over many jobs: job_cancel_many, job_retry_many, job_delete_many.

Each must decide every job exactly as its one-job method does; the tests set
up the same situations twice, apply the one-job method to one copy and the
``_many`` method to the other, and compare the decisions and the rows after.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobCancelManyParams,
    JobCancelParams,
    JobDeleteManyParams,
    JobDeleteParams,
    JobRetryManyParams,
    JobRetryParams,
)
from django_hopper.exceptions import JobRunning, NotFound, UniqueConflict
from django_hopper.ids import new_id
from django_hopper.models import JobLog
from django_hopper.types import JobOutcome
from tests.engine_conformance.support import HOUR, finalize, get, insert, result, running
from tests.engine_conformance.test_batches import make_batch
from tests.engine_conformance.test_operator import WAITING, waiting_job
from tests.factories import HistoryFactory, JobLogFactory

SITUATIONS = [*WAITING, "running", "completed", "canceled", "discarded", "held_key", "unknown"]


def situation(engine: BaseEngine, now: dt.datetime, client_id: int, name: str) -> uuid.UUID:
    """Set up one job in the named situation and return its ID."""
    if name in WAITING:
        return waiting_job(engine, now, name, client_id).id
    if name == "running":
        return running(engine, client_id, now).id
    if name in ("completed", "canceled", "discarded"):
        return HistoryFactory(now=now, state=name).id
    if name == "held_key":  # finished, while a live job holds its unique key
        key = f"k-{uuid.uuid4().hex}"
        old = running(engine, client_id, now, kind="tests.u", unique_key=key)
        finalize(engine, now, result(old, "discarded"))
        insert(engine, now, kind="tests.u", unique_key=key)
        return old.id
    if name == "unknown":
        return new_id()
    raise AssertionError(name)


def snapshot(engine: BaseEngine, job_id: uuid.UUID) -> tuple[Any, ...] | None:
    row = engine.job_get(job_id)
    if row is None:
        return None
    return (row.state, row.is_live, row.cancel_requested_at is not None, row.max_attempts)


@pytest.mark.parametrize("method", ["cancel", "retry", "delete"])
def test_many__decides_each_job_as_the_one_job_method_does(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, method: str
) -> None:
    singles = {name: situation(engine, db_now, client_id, name) for name in SITUATIONS}
    bulk = {name: situation(engine, db_now, client_id, name) for name in SITUATIONS}
    expected: dict[str, str] = {}
    for name, job_id in singles.items():
        before = engine.job_get(job_id)
        try:
            if method == "cancel":
                row = engine.job_cancel(JobCancelParams(id=job_id, now=db_now))
                if before is not None and not before.is_live:
                    expected[name] = JobOutcome.FINISHED
                elif row.state == "running":
                    expected[name] = JobOutcome.CANCEL_REQUESTED
                else:
                    expected[name] = JobOutcome.CANCELED
            elif method == "retry":
                engine.job_retry(JobRetryParams(id=job_id, now=db_now))
                expected[name] = JobOutcome.RETRIED
            else:
                engine.job_delete(JobDeleteParams(id=job_id, now=db_now))
                expected[name] = JobOutcome.DELETED
        except NotFound:
            expected[name] = JobOutcome.NOT_FOUND
        except JobRunning:
            expected[name] = JobOutcome.RUNNING
        except UniqueConflict:
            expected[name] = JobOutcome.UNIQUE_CONFLICT

    ids = list(bulk.values())
    if method == "cancel":
        got = engine.job_cancel_many(JobCancelManyParams(ids=ids, now=db_now))
    elif method == "retry":
        got = engine.job_retry_many(JobRetryManyParams(ids=ids, now=db_now))
    else:
        got = engine.job_delete_many(JobDeleteManyParams(ids=ids, now=db_now))

    assert {name: got.outcomes[bulk[name]] for name in SITUATIONS} == expected
    for name in SITUATIONS:
        assert snapshot(engine, bulk[name]) == snapshot(engine, singles[name]), name
    changed = {j.id for j in got.jobs}
    assert changed == {i for i, o in got.outcomes.items() if o not in JobOutcome.REFUSALS} - {
        bulk[n] for n in SITUATIONS if got.outcomes[bulk[n]] == JobOutcome.FINISHED
    }


def test_cancel_many__reports_a_finished_job_unchanged_not_canceled(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    done = HistoryFactory(now=db_now, state="completed").id
    got = engine.job_cancel_many(JobCancelManyParams(ids=[done], now=db_now))
    assert got.outcomes == {done: JobOutcome.FINISHED}
    assert got.jobs == []
    assert get(engine, done).state == "completed"


def test_many__an_id_given_twice_is_decided_once(engine: BaseEngine, db_now: dt.datetime) -> None:
    job = insert(engine, db_now)
    got = engine.job_cancel_many(JobCancelManyParams(ids=[job.id, job.id], now=db_now))
    assert got.outcomes == {job.id: JobOutcome.CANCELED}
    assert [j.id for j in got.jobs] == [job.id]


def test_many__no_ids_do_nothing(engine: BaseEngine) -> None:
    assert engine.job_cancel_many(JobCancelManyParams(ids=[])).outcomes == {}
    assert engine.job_retry_many(JobRetryManyParams(ids=[])).outcomes == {}
    assert engine.job_delete_many(JobDeleteManyParams(ids=[])).outcomes == {}


def test_retry_many__two_finished_jobs_with_one_unique_key_bring_back_one(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    a = HistoryFactory(now=db_now, state="discarded", kind="tests.u", unique_key="same").id
    b = HistoryFactory(now=db_now, state="discarded", kind="tests.u", unique_key="same").id
    got = engine.job_retry_many(JobRetryManyParams(ids=[a, b], now=db_now))
    assert sorted(got.outcomes.values()) == [JobOutcome.RETRIED, JobOutcome.UNIQUE_CONFLICT]
    states = sorted((get(engine, a).is_live, get(engine, b).is_live))
    assert states == [False, True]


def test_retry_many__from_start_forgets_progress_and_brings_jobs_forward(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    later = insert(engine, db_now, scheduled_at=db_now + HOUR)
    got = engine.job_retry_many(JobRetryManyParams(ids=[later.id], now=db_now, from_start=True))
    assert got.outcomes == {later.id: JobOutcome.RETRIED}
    row = get(engine, later.id)
    assert row.state == "available" and row.scheduled_at <= db_now + dt.timedelta(seconds=1)


def test_delete_many__removes_the_logs_of_deleted_jobs_only(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    gone = HistoryFactory(now=db_now, state="completed").id
    busy = running(engine, client_id, db_now).id
    JobLogFactory(job_id=gone)
    JobLogFactory(job_id=busy)
    got = engine.job_delete_many(JobDeleteManyParams(ids=[gone, busy], now=db_now))
    assert got.outcomes == {gone: JobOutcome.DELETED, busy: JobOutcome.RUNNING}
    assert list(JobLog.objects.values_list("job_id", flat=True)) == [busy]
    assert engine.job_get(gone) is None and get(engine, busy).state == "running"


def test_delete_many__removes_the_step_ledgers_of_deleted_jobs_only(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    from django_hopper.models import JobStep

    gone = HistoryFactory(now=db_now, state="completed").id
    busy = running(engine, client_id, db_now).id
    for job_id in (gone, busy):
        JobStep.objects.create(
            job_id=job_id, step="s", result={"value": "personal"}, recorded_at=db_now
        )

    engine.job_delete_many(JobDeleteManyParams(ids=[gone, busy], now=db_now))

    assert list(JobStep.objects.values_list("job_id", flat=True)) == [busy]


def test_cancel_and_delete_many__count_waiting_batch_jobs_as_failed(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    batch_id, (a, b, c) = make_batch(engine, db_now, 3)
    engine.job_cancel_many(JobCancelManyParams(ids=[a.id, b.id], now=db_now))
    engine.job_delete_many(JobDeleteManyParams(ids=[c.id], now=db_now))
    batch = engine.batch_get(batch_id)
    assert batch is not None
    assert (batch.pending, batch.failed) == (0, 3) and batch.completed_at is not None


def test_many__returns_the_changed_jobs_in_request_order(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    jobs = [insert(engine, db_now).id for _ in range(4)]
    order = [jobs[2], jobs[0], jobs[3], jobs[1]]

    retried = engine.job_retry_many(JobRetryManyParams(ids=order, now=db_now))
    canceled = engine.job_cancel_many(JobCancelManyParams(ids=order, now=db_now))
    deleted = engine.job_delete_many(JobDeleteManyParams(ids=order, now=db_now))

    assert [j.id for j in retried.jobs] == order
    assert [j.id for j in canceled.jobs] == order
    assert [j.id for j in deleted.jobs] == order
