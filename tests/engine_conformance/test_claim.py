"""job_claim: what is claimable, in which order, and what a claim writes."""

from __future__ import annotations

import datetime as dt

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobClaimParams, JobInsertParams
from django_hopper.ids import new_ids
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim,
    claim_one,
    finalize,
    get,
    insert,
    insert_many,
    register,
    result,
)
from tests.factories import JobFactory, QueueFactory


def test_claim__moves_the_job_to_running_owned_by_the_client(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = insert(engine, db_now)
    at = db_now + SECOND

    (claimed,) = claim(engine, client_id, at)

    for row in (claimed, get(engine, job)):
        assert row.id == job.id
        assert row.state == "running"
        assert row.attempt == 1
        assert row.fence == 1
        assert row.attempted_at == at
        assert row.attempted_by == client_id
        assert row.snooze_reason is None
        assert row.lease_expires_at is None


def test_claim__empty_queue_returns_nothing_and_no_wait(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    res = engine.job_claim(JobClaimParams(queue="empty", client_id=client_id, limit=5, now=db_now))

    assert res.jobs == []
    assert res.wait == dt.timedelta(0)


def test_claim__orders_by_priority_desc_then_scheduled_at_then_id(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    a, b, c, d, e = sorted(new_ids(5))
    # (id, priority, scheduled_at); inserted in an order unlike the claim order.
    rows = [
        (e, 0, db_now - 3 * MINUTE),
        (b, 5, db_now - 1 * MINUTE),
        (d, 0, db_now - 3 * MINUTE),
        (a, -5, db_now - HOUR),
        (c, 5, db_now - 2 * MINUTE),
    ]
    insert_many(
        engine,
        [JobInsertParams(kind="tests.o", id=i, priority=p, scheduled_at=s) for i, p, s in rows],
        db_now,
    )

    claimed = claim(engine, client_id, db_now, limit=10)

    assert [j.id for j in claimed] == [c, b, d, e, a]


def test_claim__takes_at_most_limit_jobs_and_leaves_the_rest(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    ids = sorted(new_ids(5))
    insert_many(engine, [JobInsertParams(kind="tests.l", id=i) for i in ids], db_now)

    first = claim(engine, client_id, db_now, limit=2)
    second = claim(engine, client_id, db_now, limit=10)

    assert [j.id for j in first] == ids[:2]
    assert [j.id for j in second] == ids[2:]
    assert claim(engine, client_id, db_now) == []


def test_claim__only_takes_jobs_of_the_given_queue(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    mine = insert(engine, db_now, queue="mine")
    insert(engine, db_now, queue="other")

    claimed = claim(engine, client_id, db_now, queue="mine")

    assert [j.id for j in claimed] == [mine.id]
    assert [j.queue for j in claimed] == ["mine"]


def test_claim__skips_jobs_scheduled_in_the_future(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now, scheduled_at=db_now + MINUTE)

    assert claim(engine, client_id, db_now) == []
    assert claim(engine, client_id, db_now + MINUTE - SECOND) == []


def test_claim__promotes_and_claims_a_scheduled_job_once_due(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = insert(engine, db_now, scheduled_at=db_now + MINUTE)

    (claimed,) = claim(engine, client_id, db_now + MINUTE)

    assert claimed.id == job.id
    assert claimed.state == "running"
    assert claimed.attempt == 1


def test_claim__promotes_and_claims_a_due_retryable_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(first, "retryable", delay=10 * SECOND))

    assert claim(engine, client_id, db_now + 9 * SECOND) == []
    (again,) = claim(engine, client_id, db_now + 10 * SECOND)

    assert again.id == first.id
    assert again.attempt == 2
    assert again.fence == 2
    assert again.attempted_at == db_now + 10 * SECOND


def test_claim__claims_a_due_retryable_job_set_up_by_the_factory(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = JobFactory(now=db_now, retryable_due=True)
    JobFactory(now=db_now, retryable_later=True)

    claimed = claim(engine, client_id, db_now)

    assert [j.id for j in claimed] == [job.id]
    assert claimed[0].attempt == 2
    assert claimed[0].fence == 2


def test_claim__skips_jobs_past_their_ttl(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now, ttl=MINUTE)

    assert claim(engine, client_id, db_now + MINUTE) == []
    assert claim(engine, client_id, db_now + 2 * MINUTE) == []


def test_claim__claims_a_job_before_its_ttl(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = insert(engine, db_now, ttl=MINUTE)

    (claimed,) = claim(engine, client_id, db_now + MINUTE - SECOND)

    assert claimed.id == job.id


def test_claim__skips_a_due_retryable_job_past_its_ttl(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    JobFactory(now=db_now, retryable_due=True, expires_at=db_now - SECOND)

    assert claim(engine, client_id, db_now) == []


def test_claim__paused_queue_claims_nothing(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    QueueFactory(now=db_now, name="held", paused=True)
    insert(engine, db_now, queue="held")

    assert claim(engine, client_id, db_now, queue="held") == []


def test_claim__a_queue_row_without_pause_does_not_hold_jobs_back(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    QueueFactory(now=db_now, name="open")
    job = insert(engine, db_now, queue="open")

    assert [j.id for j in claim(engine, client_id, db_now, queue="open")] == [job.id]


def test_claim__pausing_one_queue_does_not_hold_back_another(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    QueueFactory(now=db_now, name="held", paused=True)
    insert(engine, db_now, queue="held")
    job = insert(engine, db_now, queue="free")

    assert [j.id for j in claim(engine, client_id, db_now, queue="free")] == [job.id]


def test_claim__skips_pending_and_running_jobs(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    JobFactory(now=db_now, pending=True)
    JobFactory(now=db_now, running=True, attempted_by=client_id)

    assert claim(engine, client_id, db_now) == []


def test_claim__never_hands_out_a_running_job_twice(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    job = insert(engine, db_now)

    claim_one(engine, client_id, db_now)

    assert claim(engine, other_client_id, db_now) == []
    assert get(engine, job).attempted_by == client_id


def test_claim__each_claim_increments_the_fence(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    fences = []
    for n in range(3):
        at = db_now + n * SECOND
        job = claim_one(engine, client_id, at)
        fences.append((job.attempt, job.fence))
        finalize(engine, at, result(job, "retryable"))

    assert fences == [(1, 1), (2, 2), (3, 3)]


def test_claim__a_snoozed_claim_repeats_the_attempt_but_not_the_fence(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(first, "scheduled", snooze=True, snooze_reason="later"))

    again = claim_one(engine, client_id, db_now + SECOND)

    assert again.attempt == 1
    assert again.fence == 2


def test_claim__clears_the_snooze_reason(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(
        engine, db_now, result(first, "scheduled", delay=MINUTE, snooze=True, snooze_reason="x")
    )

    again = claim_one(engine, client_id, db_now + MINUTE)

    assert again.snooze_reason is None
    assert get(engine, again).snooze_reason is None


def test_claim__a_client_whose_lease_expired_claims_nothing(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    expiring = register(engine, db_now, ttl=MINUTE)
    job = insert(engine, db_now)

    assert claim(engine, expiring, db_now + 2 * MINUTE) == []  # the rescue may own its jobs
    assert get(engine, job).state == "available"
    assert [
        j.id for j in claim(engine, register(engine, db_now + 2 * MINUTE), db_now + 2 * MINUTE)
    ] == [job.id]


def test_claim__an_unknown_client_claims_nothing(engine: BaseEngine, db_now: dt.datetime) -> None:
    insert(engine, db_now)

    assert claim(engine, 987_654_321, db_now) == []


def test_claim__a_due_job_of_higher_priority_comes_before_an_earlier_due_one(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    low = insert(engine, db_now, scheduled_at=db_now + MINUTE)
    high = insert(engine, db_now, scheduled_at=db_now + 2 * MINUTE, priority=10)

    (first,) = claim(engine, client_id, db_now + 5 * MINUTE, limit=1)
    assert first.id == high.id
    assert [j.id for j in claim(engine, client_id, db_now + 5 * MINUTE)] == [low.id]


def test_claim__claims_a_factory_snoozed_job_once_due_and_clears_its_reason(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = JobFactory(now=db_now, snoozed=True)

    assert claim(engine, client_id, db_now) == []
    (claimed,) = claim(engine, client_id, db_now + HOUR)

    assert claimed.id == job.id
    assert claimed.snooze_reason is None
    assert claimed.attempt == 1
    assert claimed.fence == 2
