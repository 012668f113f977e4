"""Domain errors and notifications: decided by the front, the same on both engines.

Every refusal a method raises is pinned here by exception type and exact
words, so the two engines cannot drift; each is raised after the method's own
atomic block, so the caller's transaction (every test here runs in one) stays
usable. The ``_many`` methods report the same refusals as outcomes instead.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobCancelManyParams,
    JobCancelParams,
    JobClaimByIDParams,
    JobDeleteManyParams,
    JobDeleteParams,
    JobDependency,
    JobDiscardExpiredParams,
    JobInsertOpts,
    JobInsertParams,
    JobLeaseRenewParams,
    JobRetryManyParams,
    JobRetryOrderingKeyParams,
    JobRetryParams,
    JobScheduleParams,
    JobStepGetParams,
    JobStepRecordParams,
    JobStepsClearParams,
    StreamConsumerDeleteParams,
    StreamConsumerPauseParams,
    StreamConsumerResetParams,
    StreamConsumerResumeParams,
    StreamSeekParams,
    SubjectEraseParams,
    SubscriptionDeleteParams,
    SubscriptionPauseParams,
    SubscriptionResumeParams,
    WorkflowInsertParams,
)
from django_hopper.exceptions import (
    HopperError,
    JobErased,
    JobFenced,
    JobNotClaimable,
    JobRunning,
    NotFound,
    UniqueConflict,
)
from django_hopper.ids import new_id
from django_hopper.types import (
    CHANNEL_CONTROL,
    CHANNEL_DONE,
    CHANNEL_INSERT,
    ControlMessage,
    JobOutcome,
    LeaseFence,
)
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    finalize,
    insert,
    result,
    running,
    store_raw,
)
from tests.factories import HistoryFactory, QueueFactory

TTL = dt.timedelta(minutes=5)

#: A case: given the engine, the clock and a live client, the call that must be
#: refused, the exception type and its exact words.
Case = Callable[[BaseEngine, dt.datetime, int], tuple[Callable[[], Any], type[HopperError], str]]


def _held_key(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    """A finished job whose unique key a live job holds now."""
    key = f"k-{new_id().hex}"
    old = running(engine, client_id, now, kind="tests.u", unique_key=key)
    finalize(engine, now, result(old, "discarded"))
    insert(engine, now, kind="tests.u", unique_key=key)
    return old.id


def _stale(job: Any) -> dict[str, Any]:
    """The claim of ``job`` one fence behind: no longer the job's owner."""
    return {"id": job.id, "attempted_by": job.attempted_by, "fence": job.fence - 1}


def _claim_by_id(engine: BaseEngine, id: Any, now: dt.datetime, fence: int = 0) -> Any:
    return engine.job_claim_by_id(JobClaimByIDParams(id=id, fence=fence, ttl=TTL, now=now))


def _unknown(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    return new_id()


def _running(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    return running(engine, client_id, now).id


def _erased(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    job = running(engine, client_id, now, subject="person-1")
    finalize(engine, now, result(job, "discarded"))
    engine.subject_erase(SubjectEraseParams(subject="person-1", now=now))
    return job.id


#: The one-job operator methods, each called on a job ID.
ONE_JOB: dict[str, Callable[[BaseEngine, Any, dt.datetime], Any]] = {
    "cancel": lambda e, i, now: e.job_cancel(JobCancelParams(id=i, now=now)),
    "retry": lambda e, i, now: e.job_retry(JobRetryParams(id=i, now=now)),
    "delete": lambda e, i, now: e.job_delete(JobDeleteParams(id=i, now=now)),
}


def one_job(method: str, make: Callable[..., Any], kind: type[HopperError], words: str) -> Case:
    """The case of a one-job operator method refusing the job ``make`` sets up."""

    def case(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
        i = make(engine, now, client_id)
        return lambda: ONE_JOB[method](engine, i, now), kind, words.format(id=i)

    case.__name__ = f"{method}{make.__name__}"
    return case


def step_get_stale(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    job = running(engine, client_id, now)
    return (
        lambda: engine.job_step_get(JobStepGetParams(step="s", now=now, **_stale(job))),
        JobFenced,
        f"job {job.id} is no longer owned by this claim",
    )


def step_record_stale(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    job = running(engine, client_id, now)
    params = JobStepRecordParams(step="s", done=True, result=1, now=now, **_stale(job))
    return (
        lambda: engine.job_step_record(params),
        JobFenced,
        f"job {job.id} is no longer owned by this claim",
    )


def steps_clear_stale(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    job = running(engine, client_id, now)
    return (
        lambda: engine.job_steps_clear(JobStepsClearParams(now=now, **_stale(job))),
        JobFenced,
        f"job {job.id} is no longer owned by this claim",
    )


def lease_renew_stale(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    row = _claim_by_id(engine, insert(engine, now, queue="by-id").id, now)
    stale = LeaseFence(new_id(), row.lease.fence)
    return (
        lambda: engine.job_lease_renew(JobLeaseRenewParams(id=row.job.id, lease=stale, now=now)),
        JobFenced,
        f"the lease of job {row.job.id} is no longer the job's",
    )


def claim_by_id_unknown(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    i = new_id()
    return lambda: _claim_by_id(engine, i, now), NotFound, f"job {i} does not exist"


def claim_by_id_finished(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    i = HistoryFactory(now=now, state="completed").id
    return (
        lambda: _claim_by_id(engine, i, now),
        JobNotClaimable,
        f"job {i} has finished; retry it to run it again",
    )


def claim_by_id_fenced(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    i = insert(engine, now, queue="by-id").id
    return (
        lambda: _claim_by_id(engine, i, now, fence=3),
        JobFenced,
        f"job {i} is at another fence: another claim took it",
    )


def claim_by_id_running(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    job = running(engine, client_id, now)
    return (
        lambda: _claim_by_id(engine, job.id, now, fence=job.fence),
        JobRunning,
        f"job {job.id} is running",
    )


def claim_by_id_paused(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    QueueFactory(now=now, name="by-id-paused", paused=True)
    i = insert(engine, now, queue="by-id-paused").id
    return (
        lambda: _claim_by_id(engine, i, now),
        JobNotClaimable,
        f"job {i} cannot be claimed now: pending, past its TTL, in a paused queue, "
        "or behind an older job of its ordering key",
    )


def claim_by_id_undecodable(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
    i = insert(engine, now, queue="by-id").id
    store_raw(i, "progress", '"corrupt"')
    return (
        lambda: _claim_by_id(engine, i, now),
        JobNotClaimable,
        f"job {i} cannot run: stored values do not decode: "
        "progress: expected a JSON object, not the string 'corrupt'",
    )


#: The methods that take one params object naming a subscription or a consumer.
NAMED: dict[str, type[Any]] = {
    "subscription_pause": SubscriptionPauseParams,
    "subscription_resume": SubscriptionResumeParams,
    "subscription_delete": SubscriptionDeleteParams,
    "stream_consumer_pause": StreamConsumerPauseParams,
    "stream_consumer_resume": StreamConsumerResumeParams,
    "stream_consumer_reset": StreamConsumerResetParams,
    "stream_consumer_delete": StreamConsumerDeleteParams,
}

#: Every method that names a subscription or a stream consumer, called with a name.
BY_NAME: dict[str, Callable[[BaseEngine, str, dt.datetime], Any]] = {
    **{m: lambda e, n, now, m=m: getattr(e, m)(NAMED[m](name=n, now=now)) for m in NAMED},
    "stream_consumer_seek": lambda e, n, now: e.stream_consumer_seek(
        n, StreamSeekParams(latest=True)
    ),
    "stream_pump": lambda e, n, now: e.stream_pump(n, 10, now),
}


def unknown_name(method: str) -> Case:
    """The case of a method naming a subscription or consumer that does not exist."""
    what = "subscription" if method.startswith("subscription") else "stream consumer"

    def case(engine: BaseEngine, now: dt.datetime, client_id: int) -> Any:
        call = BY_NAME[method]
        return lambda: call(engine, "nobody", now), NotFound, f"no {what} is named 'nobody'"

    case.__name__ = f"{method}_unknown"
    return case


CASES: list[Case] = [
    one_job("cancel", _unknown, NotFound, "job {id} does not exist"),
    one_job("retry", _unknown, NotFound, "job {id} does not exist"),
    one_job("delete", _unknown, NotFound, "job {id} does not exist"),
    one_job("retry", _running, JobRunning, "job {id} is running; cancel it first"),
    one_job("delete", _running, JobRunning, "job {id} is running; cancel it first"),
    one_job(
        "retry",
        _held_key,
        UniqueConflict,
        "job {id} cannot be retried: a live job holds its unique key",
    ),
    one_job(
        "retry",
        _erased,
        JobErased,
        "job {id} was erased: its arguments are gone, it cannot run",
    ),
    step_get_stale,
    step_record_stale,
    steps_clear_stale,
    lease_renew_stale,
    claim_by_id_unknown,
    claim_by_id_finished,
    claim_by_id_fenced,
    claim_by_id_running,
    claim_by_id_paused,
    claim_by_id_undecodable,
    *(unknown_name(method) for method in BY_NAME),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_refusal__same_type_and_words_and_the_callers_transaction_stays_usable(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, case: Case
) -> None:
    call, kind, words = case(engine, db_now, client_id)

    with pytest.raises(HopperError) as info:
        call()

    assert type(info.value) is kind
    assert str(info.value) == words
    # A statement that failed inside the caller's transaction would break the next one.
    assert engine.job_get(new_id()) is None
    insert(engine, db_now)


def test_cancel__a_finished_job_is_returned_unchanged_not_refused(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    done = HistoryFactory(now=db_now, state="discarded")
    row = engine.job_cancel(JobCancelParams(id=done.id, now=db_now))
    assert (row.id, row.state, row.is_live) == (done.id, "discarded", False)


def test_many__report_the_refusals_as_outcomes_and_raise_nothing(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    unknown = new_id()
    busy = running(engine, client_id, db_now).id
    held = _held_key(engine, db_now, client_id)

    retried = engine.job_retry_many(JobRetryManyParams(ids=[unknown, busy, held], now=db_now))
    deleted = engine.job_delete_many(JobDeleteManyParams(ids=[unknown, busy], now=db_now))
    canceled = engine.job_cancel_many(JobCancelManyParams(ids=[unknown], now=db_now))

    assert retried.outcomes == {
        unknown: JobOutcome.NOT_FOUND,
        busy: JobOutcome.RUNNING,
        held: JobOutcome.UNIQUE_CONFLICT,
    }
    assert deleted.outcomes == {unknown: JobOutcome.NOT_FOUND, busy: JobOutcome.RUNNING}
    assert canceled.outcomes == {unknown: JobOutcome.NOT_FOUND}
    assert retried.jobs == deleted.jobs == canceled.jobs == []


# -- notifications the front decides -------------------------------------------


@pytest.fixture
def sent(engine: BaseEngine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Record what the front decides to notify (an engine without LISTEN drops it later)."""
    got: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(engine, "notify", lambda ch, payloads: got.append((ch, list(payloads))))
    return got


def test_cancel__tells_a_running_jobs_client_and_the_waiters_of_a_waiting_one(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, sent: list[Any]
) -> None:
    busy = running(engine, client_id, db_now)
    awaited = insert(engine, db_now, awaited=True)
    quiet = insert(engine, db_now)

    engine.job_cancel_many(JobCancelManyParams(ids=[busy.id, awaited.id, quiet.id], now=db_now))
    engine.job_cancel(JobCancelParams(id=busy.id, now=db_now))

    stop = (CHANNEL_CONTROL, [ControlMessage.cancel(busy.id).payload()])
    assert sent == [stop, (CHANNEL_DONE, [str(awaited.id)]), stop]


def test_cancel__of_an_unknown_or_finished_job_sends_nothing(
    engine: BaseEngine, db_now: dt.datetime, sent: list[Any]
) -> None:
    done = HistoryFactory(now=db_now, state="completed", awaited=True).id
    engine.job_cancel(JobCancelParams(id=done, now=db_now))
    with pytest.raises(NotFound):
        engine.job_cancel(JobCancelParams(id=new_id(), now=db_now))
    assert sent == []


def test_retry__wakes_the_queues_of_jobs_available_now_only(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, sent: list[Any]
) -> None:
    later = insert(engine, db_now, queue="q-later", scheduled_at=db_now + HOUR)
    finished = HistoryFactory(now=db_now, state="discarded", queue="q-done").id
    busy = running(engine, client_id, db_now)

    engine.job_retry_many(JobRetryManyParams(ids=[finished, later.id, busy.id], now=db_now))
    with pytest.raises(JobRunning):
        engine.job_retry(JobRetryParams(id=busy.id, now=db_now))

    assert sent == [(CHANNEL_INSERT, ["q-done", "q-later"])]


def test_delete__tells_the_waiters_of_an_awaited_waiting_job_only(
    engine: BaseEngine, db_now: dt.datetime, sent: list[Any]
) -> None:
    waiting = insert(engine, db_now, awaited=True)
    finished = HistoryFactory(now=db_now, state="completed", awaited=True).id

    engine.job_delete(JobDeleteParams(id=waiting.id, now=db_now))
    engine.job_delete(JobDeleteParams(id=finished, now=db_now))

    assert sent == [(CHANNEL_DONE, [str(waiting.id)])]


def test_schedule__wakes_each_queue_that_got_a_due_job_once(
    engine: BaseEngine, db_now: dt.datetime, sent: list[Any]
) -> None:
    for queue in ("q-due-b", "q-due-a", "q-due-a"):
        insert(engine, db_now, queue=queue, scheduled_at=db_now + MINUTE)
    insert(engine, db_now, queue="q-not-due", scheduled_at=db_now + HOUR)

    promoted = engine.job_schedule(JobScheduleParams(now=db_now + 2 * MINUTE))

    assert promoted == 3
    assert sent == [(CHANNEL_INSERT, ["q-due-a", "q-due-b"])]


def test_discard_expired__tells_the_waiters_of_awaited_jobs_only(
    engine: BaseEngine, db_now: dt.datetime, sent: list[Any]
) -> None:
    awaited = insert(engine, db_now, ttl=MINUTE, awaited=True)
    insert(engine, db_now, ttl=MINUTE)

    gone = engine.job_discard_expired(JobDiscardExpiredParams(now=db_now + HOUR))

    assert len(gone) == 2
    assert sent == [(CHANNEL_DONE, [str(awaited.id)])]


def test_retry_ordering_key__wakes_the_queue_only_when_a_job_became_available(
    engine: BaseEngine, db_now: dt.datetime, sent: list[Any]
) -> None:
    insert(engine, db_now, queue="q-key", ordering_key="k", scheduled_at=db_now + HOUR)

    woke = engine.job_retry_ordering_key(
        JobRetryOrderingKeyParams(queue="q-key", ordering_key="k", now=db_now)
    )
    again = engine.job_retry_ordering_key(
        JobRetryOrderingKeyParams(queue="q-key", ordering_key="none", now=db_now)
    )

    assert (woke, again) == (1, 0)
    assert sent == [(CHANNEL_INSERT, ["q-key"])]


@pytest.mark.parametrize("notify", [True, False])
def test_workflow_insert__wakes_the_queues_of_steps_that_start_available_if_asked(
    engine: BaseEngine, db_now: dt.datetime, sent: list[Any], notify: bool
) -> None:
    steps = [JobInsertParams(kind="tests.job", queue=q) for q in ("q-first", "q-then")]
    engine.workflow_insert(
        WorkflowInsertParams(
            name="two", jobs=steps, deps=[JobDependency(1, 0)], notify=notify, now=db_now
        )
    )

    assert sent == ([(CHANNEL_INSERT, ["q-first"])] if notify else [])


def test_insert_copy__wakes_the_queues_of_available_jobs_if_asked(
    engine: BaseEngine, db_now: dt.datetime, sent: list[Any]
) -> None:
    if not engine.features.supports_copy:
        pytest.skip("engine capability: no COPY (supports_copy)")
    params = [
        JobInsertParams(kind="tests.job", queue="q-copy"),
        JobInsertParams(kind="tests.job", queue="q-copy-later", scheduled_at=db_now + HOUR),
    ]
    engine.job_insert_copy(params, JobInsertOpts(now=db_now, notify=True))
    engine.job_insert_copy(params, JobInsertOpts(now=db_now))

    assert sent == [(CHANNEL_INSERT, ["q-copy"])]
