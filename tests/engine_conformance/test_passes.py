"""Pass leases of resumable runs: BEGIN with a margin, admission misses that cost
no attempt, and the takeover of expired pass leases, identical on both engines."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobClaimByIDParams,
    JobFinalize,
    JobFinalizeParams,
    JobLeaseRow,
    JobPassBeginParams,
    JobPassBegun,
    JobPassGetManyParams,
    JobPassMissParams,
    JobPassTakeoverParams,
    JobStepGetParams,
    JobStepRecordParams,
)
from django_hopper.engine.rules import LEASE_TOO_SHORT_ERROR, PASS_LEASE_EXPIRED_ERROR
from django_hopper.exceptions import InvalidJob, JobFenced
from django_hopper.types import JobRow, JobState, RescueReason
from tests.engine_conformance.support import (
    SECOND,
    claim_one,
    get,
    insert,
    register,
    running,
)

KIND = "tests.pass"
TTL = 60 * SECOND
MARGIN = 15 * SECOND


def begin(
    engine: BaseEngine, job: JobRow, now: dt.datetime, lease: JobLeaseRow | None = None, **kw: Any
) -> JobPassBegun | None:
    fields: dict[str, Any] = {"id": job.id, "fence": job.fence, "attempted_by": job.attempted_by}
    if lease is not None:
        fields.update(attempted_by=None, lease_token=lease.lease.token, fence=lease.lease.fence)
    fields.update(ttl=TTL, margin=MARGIN, now=now)
    fields.update(kw)
    return engine.job_pass_begin(JobPassBeginParams(**fields))


def miss(engine: BaseEngine, job: JobRow, now: dt.datetime, max_misses: int = 3, **kw: Any) -> Any:
    fields: dict[str, Any] = {"id": job.id, "fence": job.fence, "attempted_by": job.attempted_by}
    fields.update(max_misses=max_misses, reason="too little of the lease left", now=now)
    fields.update(kw)
    return engine.job_pass_miss(JobPassMissParams(**fields))


def takeover(engine: BaseEngine, now: dt.datetime, **kw: Any) -> Any:
    fields: dict[str, Any] = {"kinds": (KIND,), "limit": 10, "max_misses": 3, "now": now}
    fields.update(kw)
    return engine.job_pass_takeover_many(JobPassTakeoverParams(**fields))


def claimed(engine: BaseEngine, now: dt.datetime, **fields: Any) -> JobRow:
    client = register(engine, now)
    return running(engine, client, now, kind=KIND, **fields)


def by_id(engine: BaseEngine, now: dt.datetime) -> JobLeaseRow:
    job = insert(engine, now, kind=KIND, queue="passes")
    return engine.job_claim_by_id(JobClaimByIDParams(id=job.id, fence=0, ttl=TTL, now=now))


def test_pass_begin__turns_a_client_claim_into_a_pass_lease_stamped_begun(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now)

    begun = begin(engine, job, db_now + SECOND)

    assert begun is not None and begun.lease.fence == job.fence
    assert begun.expires_at == db_now + SECOND + TTL
    state = engine.job_pass_get(job.id)
    assert state is not None and state.began_at == db_now + SECOND
    row = get(engine, job)
    assert row.lease_expires_at == begun.expires_at and row.attempted_by == job.attempted_by


def test_pass_begin__refuses_a_claim_whose_lease_ends_within_the_margin(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now)

    # The client's claim leased the job for TTL from the claim: at TTL - MARGIN it
    # has exactly the margin left, which is not more than the margin.
    assert begin(engine, job, db_now + TTL - MARGIN) is None
    assert begin(engine, job, db_now + TTL + SECOND) is None  # already expired
    assert engine.job_pass_get(job.id).began_at is None  # type: ignore[union-attr]
    assert begin(engine, job, db_now + TTL - MARGIN - SECOND) is not None


def test_pass_begin__of_a_job_lease_holds_only_while_its_lease_outlasts_the_margin(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    lease = by_id(engine, db_now)

    assert begin(engine, lease.job, db_now + TTL - MARGIN, lease) is None
    begun = begin(engine, lease.job, db_now + SECOND, lease)
    assert begun is not None and begun.lease.token == lease.lease.token


def test_pass_begin__holds_once_per_claim_and_never_for_a_lost_one(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now)

    assert begin(engine, job, db_now, fence=job.fence + 1) is None
    assert begin(engine, job, db_now, attempted_by=job.attempted_by + 1) is None  # type: ignore[operator]
    assert begin(engine, job, db_now) is not None
    assert begin(engine, job, db_now) is None  # begun already: BEGIN is written once


def test_pass_begin__fences_later_writes_to_the_pass_lease_and_step_boundaries_renew_it(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now)
    begun = begin(engine, job, db_now)
    assert begun is not None
    by_client = {"id": job.id, "attempted_by": job.attempted_by, "fence": job.fence}
    by_lease = {"id": job.id, "attempted_by": None, "fence": job.fence}

    with pytest.raises(JobFenced):
        engine.job_step_get(JobStepGetParams(step="a", now=db_now, **by_client))
    engine.job_step_record(
        JobStepRecordParams(
            step="a", done=True, result=1, lease_token=begun.lease.token,
            now=db_now + 30 * SECOND, **by_lease,
        )
    )  # fmt: skip

    assert get(engine, job).lease_expires_at == db_now + 30 * SECOND + TTL


def test_pass_miss__gives_the_attempt_back_and_backs_off_doubling(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now, max_attempts=1)

    missed = miss(engine, job, db_now)

    assert missed is not None and (missed.misses, missed.failed) == (1, False)
    row = get(engine, job)
    assert row.state == JobState.SCHEDULED and row.attempt == 0
    assert row.scheduled_at == db_now + SECOND
    assert row.snooze_reason is not None and "admission miss 1/3" in row.snooze_reason
    assert engine.job_pass_get(job.id).admission_misses == 1  # type: ignore[union-attr]

    again = claim_one(engine, job.attempted_by, db_now + 2 * SECOND, queue=job.queue)  # type: ignore[arg-type]
    assert miss(engine, again, db_now + 2 * SECOND).misses == 2
    assert get(engine, job).scheduled_at == db_now + 4 * SECOND


def test_pass_miss__fails_the_run_at_the_bound_with_the_reason(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now, max_attempts=1)
    now = db_now
    for _ in range(2):
        miss(engine, job, now)
        now += 10 * SECOND
        job = claim_one(engine, job.attempted_by, now, queue=job.queue)  # type: ignore[arg-type]
        assert job.attempt == 1  # no miss was charged

    missed = miss(engine, job, now)

    assert missed is not None and (missed.misses, missed.failed) == (3, True)
    row = get(engine, job)
    assert row.state == JobState.DISCARDED
    assert row.errors[-1].rescue == RescueReason.ADMISSION_MISSED
    assert row.errors[-1].error.startswith(LEASE_TOO_SHORT_ERROR)
    assert "too little of the lease left" in row.errors[-1].error


def test_pass_miss__begin_clears_the_count_and_a_begun_claim_cannot_miss(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now)
    miss(engine, job, db_now)
    job = claim_one(engine, job.attempted_by, db_now + 5 * SECOND, queue=job.queue)  # type: ignore[arg-type]

    assert begin(engine, job, db_now + 5 * SECOND) is not None

    assert engine.job_pass_get(job.id).admission_misses == 0  # type: ignore[union-attr]
    assert miss(engine, job, db_now + 5 * SECOND) is None
    assert get(engine, job).state == JobState.RUNNING


def test_pass_takeover__charges_a_begun_pass_and_the_next_claim_takes_the_run(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now)
    begun = begin(engine, job, db_now)
    assert begun is not None

    assert takeover(engine, db_now + TTL - SECOND) == []  # not expired yet
    (taken,) = takeover(engine, db_now + TTL)

    assert (taken.id, taken.began, taken.state) == (job.id, True, JobState.RETRYABLE)
    row = get(engine, job)
    assert row.attempt == 1 and row.errors[-1].error == PASS_LEASE_EXPIRED_ERROR
    assert row.errors[-1].rescue == RescueReason.LEASE_EXPIRED
    nxt = claim_one(engine, job.attempted_by, db_now + TTL, queue=job.queue)  # type: ignore[arg-type]
    assert nxt.id == job.id and nxt.attempt == 2 and nxt.fence == job.fence + 1
    with pytest.raises(JobFenced):  # the stale pass writes nothing
        engine.job_step_record(
            JobStepRecordParams(
                id=job.id, step="a", attempted_by=None, fence=job.fence, done=True,
                lease_token=begun.lease.token, now=db_now + TTL,
            )
        )  # fmt: skip


def test_pass_takeover__of_a_claim_that_never_began_costs_no_attempt(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    lease = by_id(engine, db_now)

    (taken,) = takeover(engine, db_now + TTL)

    assert (taken.began, taken.misses, taken.state) == (False, 1, JobState.SCHEDULED)
    row = get(engine, lease.job)
    assert row.attempt == 0 and row.errors == []
    assert engine.job_pass_get(lease.job.id).admission_misses == 1  # type: ignore[union-attr]


def test_pass_takeover__leaves_ordinary_leases_other_queues_and_live_leases_alone(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    mine = claimed(engine, db_now)
    assert begin(engine, mine, db_now) is not None
    other = insert(engine, db_now, kind="tests.other", queue="passes")
    engine.job_claim_by_id(JobClaimByIDParams(id=other.id, fence=0, ttl=TTL, now=db_now))

    assert takeover(engine, db_now + TTL, queue="elsewhere") == []
    # A begun pass lease is taken over whatever its kind; an ordinary job lease is not.
    assert [t.id for t in takeover(engine, db_now + TTL, kinds=())] == [mine.id]
    assert get(engine, other).state == JobState.RUNNING


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"ttl": dt.timedelta(microseconds=1)}, "ttl"),
        ({"ttl": 0.5 * SECOND, "margin": dt.timedelta(0)}, "ttl"),
        ({"margin": TTL}, "margin"),
        ({"margin": -SECOND}, "margin"),
        ({"fence": 0}, "fence"),
        ({"attempted_by": None}, "attempted_by"),
    ],
)
def test_pass_begin__refuses_bad_input_naming_the_field(
    engine: BaseEngine, db_now: dt.datetime, fields: dict[str, Any], field: str
) -> None:
    job = claimed(engine, db_now)

    with pytest.raises(InvalidJob) as info:
        begin(engine, job, db_now, **fields)

    assert info.value.field == field
    assert engine.job_pass_get(job.id).began_at is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kinds": ["tests.pass"]}, "kinds"),
        ({"kinds": ("",)}, "kinds"),
        ({"limit": -1}, "limit"),
        ({"max_misses": 0}, "max_misses"),
    ],
)
def test_pass_takeover__refuses_bad_input_naming_the_field(
    engine: BaseEngine, db_now: dt.datetime, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidJob) as info:
        takeover(engine, db_now, **fields)
    assert info.value.field == field


def test_pass_miss__refuses_a_missing_bound_or_reason(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = claimed(engine, db_now)
    with pytest.raises(InvalidJob) as info:
        miss(engine, job, db_now, max_misses=0)
    assert info.value.field == "max_misses"
    with pytest.raises(InvalidJob) as info:
        miss(engine, job, db_now, reason="")
    assert info.value.field == "reason"
    assert get(engine, job).state == JobState.RUNNING


def test_pass_takeover__ends_a_pass_whose_worker_stopped_renewing_its_own_lease(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    client = register(engine, db_now, ttl=10 * SECOND)
    job = running(engine, client, db_now, kind=KIND)
    assert begin(engine, job, db_now) is not None

    assert takeover(engine, db_now + 9 * SECOND) == []  # worker and lease both alive
    (taken,) = takeover(engine, db_now + 10 * SECOND)  # the worker's lease expired

    assert (taken.id, taken.began, taken.state) == (job.id, True, JobState.RETRYABLE)


def test_pass_get__reads_live_runs_only_and_a_begun_pass_ends_by_its_lease(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    from django_hopper.ids import new_id

    job = claimed(engine, db_now)
    begun = begin(engine, job, db_now)
    assert begun is not None
    finish = JobFinalize(
        id=job.id, attempted_by=None, fence=job.fence, state=JobState.COMPLETED,
        lease_token=begun.lease.token,
    )  # fmt: skip

    assert engine.job_pass_get(new_id()) is None
    by_client = dataclasses.replace(finish, attempted_by=job.attempted_by, lease_token=None)
    # From BEGIN on the pass lease owns the run: its worker's client no longer does.
    assert engine.job_finalize_many(JobFinalizeParams(jobs=[by_client], now=db_now)) == []
    assert engine.job_finalize_many(JobFinalizeParams(jobs=[finish], now=db_now))
    assert engine.job_pass_get(job.id) is None  # finished: in history now


def test_pass_get_many__reads_live_runs_in_request_order_in_one_call(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    from django_hopper.ids import new_id

    begun_job = claimed(engine, db_now)
    assert begin(engine, begun_job, db_now) is not None
    missed_job = claimed(engine, db_now)
    assert miss(engine, missed_job, db_now) is not None
    unknown = new_id()

    rows = engine.job_pass_get_many(
        JobPassGetManyParams(ids=[missed_job.id, unknown, begun_job.id, missed_job.id])
    )

    assert [r.id for r in rows] == [missed_job.id, begun_job.id]
    missed_row, begun_row = rows
    assert (missed_row.admission_misses, missed_row.began_at) == (1, None)
    assert (begun_row.admission_misses, begun_row.began_at) == (0, db_now)
    assert engine.job_pass_get_many(JobPassGetManyParams(ids=[])) == []
    with pytest.raises(InvalidJob) as refused:
        engine.job_pass_get_many(JobPassGetManyParams(ids=[str(begun_job.id)]))
    assert refused.value.field == "ids"
