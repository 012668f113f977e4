"""Operator actions and the leader's job sweeps: job_cancel, job_retry, job_delete,
job_discard_expired, job_rescue_candidates, job_schedule."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobCancelParams,
    JobDeleteParams,
    JobDiscardExpiredParams,
    JobRecordProgressParams,
    JobRescueParams,
    JobRetryParams,
    JobScheduleParams,
)
from django_hopper.exceptions import JobRunning, NotFound, UniqueConflict
from django_hopper.ids import new_id
from django_hopper.models import Job
from django_hopper.types import JobRow, Progress
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim,
    claim_one,
    finalize,
    get,
    insert,
    list_ids,
    live_ids,
    register,
    result,
    running,
)
from tests.factories import ClientFactory, HistoryFactory, JobFactory, JobLogFactory, aware_utc


def cancel(engine: BaseEngine, job_id: object, now: dt.datetime) -> JobRow:
    return engine.job_cancel(JobCancelParams(id=job_id, now=now))  # type: ignore[arg-type]


def retry(engine: BaseEngine, job_id: object, now: dt.datetime, **kw: bool) -> JobRow:
    return engine.job_retry(JobRetryParams(id=job_id, now=now, **kw))  # type: ignore[arg-type]


def delete(engine: BaseEngine, job_id: object, now: dt.datetime) -> JobRow:
    return engine.job_delete(JobDeleteParams(id=job_id, now=now))  # type: ignore[arg-type]


def waiting_job(engine: BaseEngine, now: dt.datetime, state: str, client_id: int) -> JobRow:
    """A job waiting in ``state``, set up through the engine (pending: the factory)."""
    if state == "available":
        return insert(engine, now)
    if state == "scheduled":
        return insert(engine, now, scheduled_at=now + HOUR)
    if state == "retryable":
        job = running(engine, client_id, now)
        finalize(engine, now, result(job, "retryable", delay=HOUR))
        return get(engine, job)
    if state == "pending":
        return get(engine, JobFactory(now=now, pending=True).id)
    raise AssertionError(state)


WAITING = ["available", "scheduled", "retryable", "pending"]


# -- job_cancel -----------------------------------------------------------------------


@pytest.mark.parametrize("state", WAITING)
def test_cancel__moves_a_waiting_job_to_history_as_canceled(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = waiting_job(engine, db_now, state, client_id)
    at = db_now + SECOND

    canceled = cancel(engine, job.id, at)

    for row in (canceled, get(engine, job)):
        assert row.id == job.id
        assert row.state == "canceled"
        assert row.finalized_at == at
        assert row.attempt == job.attempt
        assert row.errors[:-1] == job.errors
        last = row.errors[-1]
        assert (last.error, last.attempt, last.rescue, last.fence, last.at) == (
            "canceled",
            job.attempt,
            "canceled",
            0,
            at,
        )
    assert live_ids(engine) == []


def test_cancel__a_snoozed_job_loses_its_snooze_reason(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "scheduled", delay=HOUR, snooze=True, snooze_reason="r"))

    canceled = cancel(engine, job.id, db_now)

    assert canceled.state == "canceled"
    assert canceled.snooze_reason is None


def test_cancel__requests_the_cancel_of_a_running_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    at = db_now + SECOND

    requested = cancel(engine, job.id, at)

    for row in (requested, get(engine, job)):
        assert row.state == "running"
        assert row.cancel_requested_at == at
        assert row.attempted_by == client_id
        assert row.fence == job.fence
        assert row.finalized_at is None


def test_cancel__a_repeated_request_keeps_the_first_time(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    cancel(engine, job.id, db_now)

    again = cancel(engine, job.id, db_now + MINUTE)

    assert again.cancel_requested_at == db_now
    assert get(engine, job).cancel_requested_at == db_now


@pytest.mark.parametrize("state", ["completed", "canceled", "discarded"])
def test_cancel__returns_a_finalized_job_unchanged(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, state, output="out"))
    before = get(engine, job)

    after = cancel(engine, job.id, db_now + HOUR)

    assert after == before
    assert get(engine, job) == before


def test_cancel__an_unknown_job_is_not_found(engine: BaseEngine, db_now: dt.datetime) -> None:
    with pytest.raises(NotFound):
        cancel(engine, new_id(), db_now)


# -- job_retry ----------------------------------------------------------------------------


def test_retry__a_running_job_is_refused(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    with pytest.raises(JobRunning):
        retry(engine, job.id, db_now)
    assert get(engine, job).state == "running"


def test_retry__an_unknown_job_is_not_found(engine: BaseEngine, db_now: dt.datetime) -> None:
    with pytest.raises(NotFound):
        retry(engine, new_id(), db_now)


@pytest.mark.parametrize("state", ["canceled", "discarded", "completed"])
def test_retry__brings_a_finalized_job_back_from_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = running(engine, client_id, db_now, max_attempts=5, ttl=HOUR)
    finalize(engine, db_now, result(job, state, output="out"))
    at = db_now + MINUTE

    retried = retry(engine, job.id, at)

    for row in (retried, get(engine, job)):
        assert row.state == "available"
        assert row.scheduled_at == at
        assert row.expires_at is None
        assert row.finalized_at is None
        assert row.output is None
        assert row.fence == 1
        assert row.attempt == 1
        assert row.max_attempts == 5
    assert live_ids(engine) == [job.id]
    assert list_ids(engine, states=(state,)) == []


def test_retry__keeps_the_errors_of_a_job_from_history(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    discarded = HistoryFactory(now=db_now, discarded=True)
    before = get(engine, discarded.id).errors

    retried = retry(engine, discarded.id, db_now)

    assert len(before) == 3
    assert retried.errors == before


def test_retry__allows_one_more_attempt_to_a_job_that_ran_out(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, max_attempts=1)
    finalize(engine, db_now, result(job, "discarded"))

    retried = retry(engine, job.id, db_now)

    assert retried.attempt == 1
    assert retried.max_attempts == 2
    (claimed,) = claim(engine, client_id, db_now, queue=job.queue)
    assert claimed.attempt == 2
    assert claimed.fence == 2


def test_retry__a_unique_job_conflicts_with_a_live_job_of_the_same_key(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    old = running(engine, client_id, db_now, kind="tests.u", unique_key="k")
    finalize(engine, db_now, result(old, "discarded"))
    live = insert(engine, db_now, kind="tests.u", unique_key="k")

    with pytest.raises(UniqueConflict):
        retry(engine, old.id, db_now)

    assert get(engine, old).state == "discarded"
    assert live_ids(engine, kinds=("tests.u",)) == [live.id]


@pytest.mark.parametrize("state", ["scheduled", "retryable"])
def test_retry__a_waiting_job_becomes_available_now(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = waiting_job(engine, db_now, state, client_id)
    at = db_now + SECOND

    retried = retry(engine, job.id, at)

    for row in (retried, get(engine, job)):
        assert row.state == "available"
        assert row.scheduled_at == at
        assert row.attempt == job.attempt
        assert row.fence == job.fence
    assert [j.id for j in claim(engine, client_id, at, queue=job.queue)] == [job.id]


def test_retry__clears_the_ttl_and_the_snooze_reason_of_a_waiting_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, ttl=HOUR)
    finalize(engine, db_now, result(job, "scheduled", delay=HOUR, snooze=True, snooze_reason="r"))

    retried = retry(engine, job.id, db_now)

    assert retried.state == "available"
    assert retried.expires_at is None
    assert retried.snooze_reason is None
    assert retried.attempt == 0


def test_retry__a_pending_job_stays_pending(engine: BaseEngine, db_now: dt.datetime) -> None:
    job = JobFactory(now=db_now - HOUR, pending=True, scheduled_at=db_now - HOUR)

    retried = retry(engine, job.id, db_now)

    assert retried.state == "pending"
    assert retried.scheduled_at == db_now


def test_retry__keeps_progress_unless_from_start(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    engine.job_record_progress(
        JobRecordProgressParams(
            id=job.id,
            attempted_by=client_id,
            fence=job.fence,
            attempt=job.attempt,
            step="s2",
            cursor=7,
            now=db_now,
        )
    )
    finalize(engine, db_now, result(job, "discarded"))

    kept = retry(engine, job.id, db_now)
    assert kept.progress == Progress("s2", 7, db_now)

    cancel(engine, job.id, db_now)
    cleared = retry(engine, job.id, db_now, from_start=True)
    assert cleared.progress is None
    assert get(engine, job).progress is None


def test_retry__from_start_clears_the_progress_of_a_waiting_job(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = JobFactory(
        now=db_now,
        retryable_later=True,
        progress={"step": "a", "cursor": None, "at": db_now.isoformat()},
    )

    assert retry(engine, job.id, db_now).progress == Progress("a", None, db_now)
    assert retry(engine, job.id, db_now, from_start=True).progress is None


# -- job_delete -------------------------------------------------------------------------


def test_delete__a_running_job_is_refused(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    with pytest.raises(JobRunning):
        delete(engine, job.id, db_now)
    assert get(engine, job).state == "running"


def test_delete__an_unknown_job_is_not_found(engine: BaseEngine, db_now: dt.datetime) -> None:
    with pytest.raises(NotFound):
        delete(engine, new_id(), db_now)


@pytest.mark.parametrize("state", WAITING)
def test_delete__removes_a_waiting_job_and_returns_it_as_it_was(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = waiting_job(engine, db_now, state, client_id)
    JobLogFactory(now=db_now, job_id=job.id)

    deleted = delete(engine, job.id, db_now)

    assert deleted.id == job.id
    assert deleted.state == state
    assert engine.job_get(job.id) is None
    assert engine.job_logs(job.id) == []
    assert list_ids(engine) == []


def test_delete__removes_a_job_from_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "completed", output=1, log="done\n"))

    deleted = delete(engine, job.id, db_now)

    assert deleted.state == "completed"
    assert deleted.output == 1
    assert engine.job_get(job.id) is None
    assert engine.job_logs(job.id) == []


@pytest.mark.parametrize("finished", [False, True])
def test_delete__removes_the_jobs_step_ledger_at_once(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, finished: bool
) -> None:
    from django_hopper.models import JobStep

    job = running(engine, client_id, db_now)
    other = running(engine, client_id, db_now)
    for owner in (job, other):
        JobStep.objects.create(
            job_id=owner.id,
            step="fetch",
            result={"value": {"email": "a@b.c"}},
            attempts=1,
            recorded_at=db_now,
        )
    outcome = "completed" if finished else "retryable"
    finalize(engine, db_now, result(job, outcome, output=1))

    delete(engine, job.id, db_now)

    assert list(JobStep.objects.values_list("job_id", flat=True)) == [other.id]


# -- job_discard_expired ------------------------------------------------------------------


@pytest.mark.parametrize("state", WAITING)
def test_discard_expired__discards_a_waiting_job_past_its_ttl(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = waiting_job(engine, db_now, state, client_id)
    Job.objects.filter(id=job.id).update(expires_at=aware_utc(db_now + MINUTE))
    at = db_now + MINUTE

    (discarded,) = engine.job_discard_expired(JobDiscardExpiredParams(now=at))

    for row in (discarded, get(engine, job)):
        assert row.id == job.id
        assert row.state == "discarded"
        assert row.finalized_at == at
        last = row.errors[-1]
        assert (last.error, last.rescue, last.at) == (
            "expired before it could run",
            "ttl_expired",
            at,
        )
    assert live_ids(engine) == []


def test_discard_expired__leaves_jobs_before_their_ttl_and_without_one(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    insert(engine, db_now, ttl=HOUR)
    insert(engine, db_now)

    assert engine.job_discard_expired(JobDiscardExpiredParams(now=db_now + HOUR - SECOND)) == []
    assert len(live_ids(engine)) == 2


def test_discard_expired__leaves_running_jobs_alone(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, ttl=MINUTE)

    assert engine.job_discard_expired(JobDiscardExpiredParams(now=db_now + HOUR)) == []
    assert get(engine, job).state == "running"


def test_discard_expired__takes_at_most_limit_jobs(engine: BaseEngine, db_now: dt.datetime) -> None:
    for _ in range(3):
        insert(engine, db_now, ttl=MINUTE)

    first = engine.job_discard_expired(JobDiscardExpiredParams(limit=2, now=db_now + HOUR))
    rest = engine.job_discard_expired(JobDiscardExpiredParams(limit=2, now=db_now + HOUR))

    assert len(first) == 2
    assert len(rest) == 1
    assert live_ids(engine) == []


# -- job_rescue_candidates ----------------------------------------------------------------


def rescue(
    engine: BaseEngine,
    now: dt.datetime,
    stuck_after: dt.timedelta = dt.timedelta(0),
    limit: int = 1000,
) -> list[tuple[object, bool]]:
    found = engine.job_rescue_candidates(
        JobRescueParams(stuck_after=stuck_after, limit=limit, now=now)
    )
    return [(c.job.id, c.stuck) for c in found]


def test_rescue_candidates__a_job_of_an_expired_client(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    short = register(engine, db_now, ttl=MINUTE)
    job = running(engine, short, db_now)

    assert rescue(engine, db_now + MINUTE - SECOND) == []
    assert rescue(engine, db_now + MINUTE) == [(job.id, False)]


def test_rescue_candidates__returns_the_job_as_claimed(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    short = register(engine, db_now, ttl=MINUTE)
    job = running(engine, short, db_now)

    (candidate,) = engine.job_rescue_candidates(JobRescueParams(now=db_now + HOUR))

    assert candidate.job.state == "running"
    assert candidate.job.fence == job.fence
    assert candidate.job.attempted_by == short
    assert candidate.stuck is False


def test_rescue_candidates__a_job_of_a_deleted_client(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    gone = register(engine, db_now)
    job = running(engine, gone, db_now)
    engine.client_delete(gone)

    assert rescue(engine, db_now) == [(job.id, False)]


def test_rescue_candidates__a_live_client_keeps_its_jobs(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    running(engine, client_id, db_now)

    assert rescue(engine, db_now + MINUTE) == []


def test_rescue_candidates__stuck_jobs_of_a_live_client_with_stuck_after(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    assert rescue(engine, db_now + 10 * MINUTE) == []
    assert rescue(engine, db_now + 10 * MINUTE - SECOND, stuck_after=10 * MINUTE) == []
    assert rescue(engine, db_now + 10 * MINUTE, stuck_after=10 * MINUTE) == [(job.id, True)]


def test_rescue_candidates__an_expired_client_wins_over_stuck(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    short = register(engine, db_now, ttl=MINUTE)
    job = running(engine, short, db_now)

    assert rescue(engine, db_now + HOUR, stuck_after=MINUTE) == [(job.id, False)]


def test_rescue_candidates__oldest_claim_first_up_to_limit(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    # Live while it claims (a claim needs a live lease), expired 30 s before db_now.
    short = register(engine, db_now - HOUR, ttl=HOUR - MINUTE / 2)
    newer = running(engine, short, db_now - 2 * MINUTE)
    older = running(engine, short, db_now - 5 * MINUTE)
    newest = running(engine, short, db_now - MINUTE)

    assert rescue(engine, db_now) == [(older.id, False), (newer.id, False), (newest.id, False)]
    assert rescue(engine, db_now, limit=2) == [(older.id, False), (newer.id, False)]


def test_rescue_candidates__ignores_waiting_and_finalized_jobs(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    expired = ClientFactory(now=db_now, expired=True)
    JobFactory(now=db_now, retryable_due=True, attempted_by=expired.id)
    HistoryFactory(now=db_now, attempted_by=expired.id)

    assert rescue(engine, db_now, stuck_after=SECOND) == []


def test_rescue_candidates__a_leased_job_is_not_a_client_candidate(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    JobFactory(now=db_now, leased=True)

    assert rescue(engine, db_now + MINUTE) == []


# -- job_schedule ------------------------------------------------------------------------------


def test_schedule__makes_due_scheduled_and_retryable_jobs_available(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    due_scheduled = insert(engine, db_now, scheduled_at=db_now + MINUTE)
    later = insert(engine, db_now, scheduled_at=db_now + HOUR)
    failed = running(engine, client_id, db_now)
    finalize(engine, db_now, result(failed, "retryable", delay=MINUTE))

    count = engine.job_schedule(JobScheduleParams(now=db_now + MINUTE))

    assert count == 2
    assert get(engine, due_scheduled).state == "available"
    assert get(engine, failed).state == "available"
    assert get(engine, later).state == "scheduled"


def test_schedule__clears_the_snooze_reason_of_a_promoted_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "scheduled", delay=MINUTE, snooze=True, snooze_reason="r"))

    assert engine.job_schedule(JobScheduleParams(now=db_now + MINUTE)) == 1

    stored = get(engine, job)
    assert stored.state == "available"
    assert stored.snooze_reason is None


def test_schedule__only_the_given_queue(engine: BaseEngine, db_now: dt.datetime) -> None:
    mine = insert(engine, db_now, queue="qa", scheduled_at=db_now + SECOND)
    other = insert(engine, db_now, queue="qb", scheduled_at=db_now + SECOND)

    assert engine.job_schedule(JobScheduleParams(queue="qa", now=db_now + MINUTE)) == 1

    assert get(engine, mine).state == "available"
    assert get(engine, other).state == "scheduled"


def test_schedule__at_most_limit_jobs(engine: BaseEngine, db_now: dt.datetime) -> None:
    for _ in range(3):
        insert(engine, db_now, scheduled_at=db_now + SECOND)

    assert engine.job_schedule(JobScheduleParams(limit=2, now=db_now + MINUTE)) == 2
    assert engine.job_schedule(JobScheduleParams(limit=2, now=db_now + MINUTE)) == 1
    assert engine.job_schedule(JobScheduleParams(now=db_now + MINUTE)) == 0


def test_schedule__promoted_jobs_are_claimed_as_available(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = insert(engine, db_now, scheduled_at=db_now + SECOND)
    engine.job_schedule(JobScheduleParams(now=db_now + SECOND))

    assert claim_one(engine, client_id, db_now + SECOND).id == job.id


def test_schedule__sweeps_every_queue_holding_due_jobs(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    due = [
        insert(engine, db_now, queue=q, scheduled_at=db_now + SECOND)
        for q in ("qc", "qa", "qb", "qa")
    ]
    later = insert(engine, db_now, queue="qa0", scheduled_at=db_now + HOUR)

    assert engine.job_schedule(JobScheduleParams(now=db_now + MINUTE)) == 4

    assert [get(engine, job).state for job in due] == ["available"] * 4
    assert get(engine, later).state == "scheduled"


def test_schedule__limit_counts_the_jobs_of_every_queue(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    for q in ("qa", "qb", "qc"):
        for _ in range(2):
            insert(engine, db_now, queue=q, scheduled_at=db_now + SECOND)

    assert engine.job_schedule(JobScheduleParams(limit=4, now=db_now + MINUTE)) == 4
    assert engine.job_schedule(JobScheduleParams(limit=4, now=db_now + MINUTE)) == 2


def test_schedule__a_full_sweep_takes_the_queue_waiting_longest_first(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    """No queue takes precedence by its name: a queue whose due job waited
    longest is swept first, so a queue early in name order that keeps every
    sweep full cannot starve one later in it."""
    busy = [insert(engine, db_now, queue="qa", scheduled_at=db_now + k * SECOND) for k in (2, 3, 4)]
    waiting = insert(engine, db_now, queue="qz", scheduled_at=db_now + SECOND)

    assert engine.job_schedule(JobScheduleParams(limit=2, now=db_now + MINUTE)) == 2

    assert get(engine, waiting).state == "available"
    assert [get(engine, job).state for job in busy] == ["available", "scheduled", "scheduled"]
