"""Claims ahead of the free slots: what the claim marks, how a return gives jobs back,
and how the rescue counts a claimed-ahead job (an admission miss, never an attempt)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobCancelParams,
    JobClaimParams,
    JobInsertParams,
    JobRescueParams,
    JobReturnManyParams,
)
from django_hopper.engine.rules import AHEAD_LOST_ERROR, AHEAD_MISS_REASON
from django_hopper.exceptions import InvalidJob
from django_hopper.ids import new_ids
from django_hopper.maintenance import Rescuer
from django_hopper.models import Job
from django_hopper.types import JobRow, JobState, RescueReason
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    finalize,
    get,
    insert,
    insert_many,
    register,
    result,
)
from tests.factories import QueueFactory


def claim_ahead(
    engine: BaseEngine,
    client_id: int,
    now: dt.datetime,
    limit: int,
    ahead: int,
    queue: str = "ahead",
    limited: bool = False,
) -> tuple[list[JobRow], frozenset[object]]:
    got = engine.job_claim(
        JobClaimParams(
            queue=queue, client_id=client_id, limit=limit, ahead=ahead, now=now, limited=limited
        )
    )
    return got.jobs, got.ahead


def ahead_marked(job: JobRow) -> bool:
    return Job.objects.get(id=job.id).claimed_ahead_at is not None


def give_back(
    engine: BaseEngine, jobs: list[JobRow], now: dt.datetime, client_id: int | None = None
) -> list[object]:
    by = client_id if client_id is not None else jobs[0].attempted_by
    assert by is not None
    return list(
        engine.job_return_many(
            JobReturnManyParams(client_id=by, jobs=[(j.id, j.fence) for j in jobs], now=now)
        )
    )


def test_claim_ahead__marks_only_the_jobs_beyond_the_free_slots_in_claim_order(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    ids = sorted(new_ids(5))
    insert_many(engine, [JobInsertParams(kind="tests.a", id=i, queue="ahead") for i in ids], db_now)

    jobs, ahead = claim_ahead(engine, client_id, db_now + SECOND, limit=2, ahead=2)

    assert [j.id for j in jobs] == ids[:4]
    assert ahead == frozenset(ids[2:4])
    assert [ahead_marked(j) for j in jobs] == [False, False, True, True]
    assert all(j.state == "running" and j.attempt == 1 for j in jobs)
    assert get(engine, ids[4]).state == "available"


def test_claim_ahead__with_no_free_slot_claims_only_ahead(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    for _ in range(3):
        insert(engine, db_now, queue="ahead")

    jobs, ahead = claim_ahead(engine, client_id, db_now + SECOND, limit=0, ahead=2)

    assert len(jobs) == 2 and ahead == frozenset(j.id for j in jobs)


def test_claim_ahead__never_takes_a_keyed_job_ahead(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    keyed = insert(engine, db_now, queue="ahead", ordering_key="k", priority=5)
    plain = [insert(engine, db_now + SECOND * i, queue="ahead") for i in range(1, 3)]

    jobs, ahead = claim_ahead(engine, client_id, db_now + MINUTE, limit=0, ahead=5)

    assert {j.id for j in jobs} == {p.id for p in plain} == ahead
    assert get(engine, keyed).state == "available"
    # Within the free slots a keyed head is claimed as before, unmarked.
    jobs, ahead = claim_ahead(engine, client_id, db_now + MINUTE, limit=1, ahead=5)
    assert [j.id for j in jobs] == [keyed.id] and ahead == frozenset()


def test_claim_ahead__the_limited_path_never_claims_ahead(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    QueueFactory(name="ahead", global_limit=100)
    for _ in range(4):
        insert(engine, db_now, queue="ahead")

    jobs, ahead = claim_ahead(engine, client_id, db_now + SECOND, 1, 3, limited=True)

    assert len(jobs) == 1 and ahead == frozenset() and not ahead_marked(jobs[0])


def test_return_many__gives_back_the_attempt_keeps_the_fence_and_refuses_a_late_result(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    for _ in range(3):
        insert(engine, db_now, queue="ahead")
    jobs, ahead = claim_ahead(engine, client_id, db_now + SECOND, limit=1, ahead=2)
    held = [j for j in jobs if j.id in ahead]
    started = [j for j in jobs if j.id not in ahead]

    returned = give_back(engine, [*held, *started], db_now + 2 * SECOND)

    # Only the jobs claimed ahead go back; the started one is left running.
    assert set(returned) == {j.id for j in held}
    assert get(engine, started[0]).state == "running"
    for j in held:
        row = get(engine, j)
        assert (row.state, row.attempt, row.fence) == ("available", 0, 1)
        assert row.errors == [] and not ahead_marked(row)
        assert Job.objects.get(id=j.id).admission_misses is None
    assert finalize(engine, db_now + 3 * SECOND, result(held[0], "completed")) == []
    assert get(engine, held[0]).state == "available"
    # A second return finds nothing of that claim.
    assert give_back(engine, held, db_now + 3 * SECOND) == []
    # Claimed again, the job gets its first attempt at the next fence.
    again, _ = claim_ahead(engine, client_id, db_now + 4 * SECOND, limit=5, ahead=0)
    assert {(j.attempt, j.fence) for j in again if j.id == held[0].id} == {(1, 2)}


def test_return_many__is_fenced_to_the_client_and_fence_and_skips_a_cancel_request(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    for _ in range(3):
        insert(engine, db_now, queue="ahead")
    jobs, _ = claim_ahead(engine, client_id, db_now + SECOND, limit=0, ahead=3)
    other = register(engine, db_now)
    engine.job_cancel(JobCancelParams(id=jobs[2].id, now=db_now + SECOND))

    assert give_back(engine, jobs, db_now + 2 * SECOND, client_id=other) == []
    stale = engine.job_return_many(
        JobReturnManyParams(client_id=client_id, jobs=[(jobs[0].id, jobs[0].fence + 1)])
    )
    assert stale == []
    assert set(give_back(engine, jobs, db_now + 2 * SECOND)) == {jobs[0].id, jobs[1].id}
    asked = get(engine, jobs[2])
    assert asked.state == "running" and asked.cancel_requested_at is not None


def test_return_many__validates_its_pairs(engine: BaseEngine, client_id: int) -> None:
    with pytest.raises(InvalidJob) as caught:
        engine.job_return_many(JobReturnManyParams(client_id=client_id, jobs=[("x", 1)]))  # type: ignore[list-item]
    assert caught.value.field == "jobs"
    assert engine.job_return_many(JobReturnManyParams(client_id=client_id, jobs=[])) == []


def test_rescue__counts_a_claimed_ahead_job_as_an_admission_miss_not_an_attempt(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    gone = register(engine, db_now, ttl=MINUTE)
    for _ in range(3):
        insert(engine, db_now, queue="ahead", max_attempts=1)
    jobs, ahead = claim_ahead(engine, gone, db_now + SECOND, limit=1, ahead=2)
    later = db_now + HOUR

    candidates = engine.job_rescue_candidates(JobRescueParams(now=later))
    assert {c.job.id for c in candidates if c.ahead} == ahead
    assert Rescuer(engine).run_once(now=later) == 3

    for j in jobs:
        row = get(engine, j)
        if j.id in ahead:
            # Nothing tells whether it started: the attempt is given back, a miss counted.
            assert (row.state, row.attempt) == ("scheduled", 0)
            assert Job.objects.get(id=j.id).admission_misses == 1
            assert row.snooze_reason is not None
            assert row.snooze_reason.startswith(f"{AHEAD_MISS_REASON} 1/")
            assert row.errors == []
        else:
            # Claimed into a free slot: today's rescue, a charged attempt (the last one).
            assert (row.state, row.attempt) == ("discarded", 1)
            assert row.errors[-1].rescue == RescueReason.CLIENT_EXPIRED


def test_rescue__discards_a_job_lost_ahead_too_often_with_the_reason(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    from django.test import override_settings

    job = insert(engine, db_now, queue="ahead")
    now = db_now
    with override_settings(HOPPER={"ADMISSION_MISS_MAX": 2}):
        for _ in range(2):
            now += HOUR
            gone = register(engine, now, ttl=MINUTE)
            jobs, ahead = claim_ahead(engine, gone, now + SECOND, limit=0, ahead=1)
            assert [j.id for j in jobs] == [job.id] and ahead == {job.id}
            now += 2 * HOUR
            assert Rescuer(engine).run_once(now=now) == 1

    row = get(engine, job)
    # Each miss gave its attempt back; the discarding claim keeps its own.
    assert row.state == JobState.DISCARDED and row.attempt == 1
    assert row.errors[-1].rescue == RescueReason.ADMISSION_MISSED
    assert row.errors[-1].error.startswith(AHEAD_LOST_ERROR)


@pytest.mark.parametrize("limited", [False, True])
def test_rescue__charges_a_job_claimed_ahead_once_then_retried_into_a_free_slot(
    engine: BaseEngine, db_now: dt.datetime, limited: bool
) -> None:
    job = insert(engine, db_now, queue="ahead", max_attempts=3)
    first = register(engine, db_now)
    jobs, ahead = claim_ahead(engine, first, db_now + SECOND, limit=0, ahead=1)
    assert ahead == {job.id}
    # It left the buffer, ran and failed: retryable at once, the mark still on the row.
    assert finalize(engine, db_now + 2 * SECOND, result(jobs[0], "retryable"))
    gone = register(engine, db_now + 3 * SECOND, ttl=MINUTE)
    again, ahead = claim_ahead(engine, gone, db_now + 4 * SECOND, limit=1, ahead=0, limited=limited)
    assert [j.id for j in again] == [job.id] and ahead == frozenset()
    assert not ahead_marked(again[0])

    later = db_now + HOUR
    candidates = engine.job_rescue_candidates(JobRescueParams(now=later))
    assert [c.ahead for c in candidates if c.job.id == job.id] == [False]
    assert Rescuer(engine).run_once(now=later) == 1
    row = get(engine, job)
    # Claimed into a free slot: a charged attempt, no admission miss.
    assert (row.state, row.attempt) == ("retryable", 2)
    assert row.errors[-1].rescue == RescueReason.CLIENT_EXPIRED
    assert Job.objects.get(id=job.id).admission_misses is None
