"""Job leases: claim by ID (errors in the seed's order), renewal, expiry, and the
finalize and progress fences of a leased attempt."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobCancelParams,
    JobClaimByIDParams,
    JobExpireLeasesParams,
    JobFinalize,
    JobLeaseRenewParams,
    JobLeaseRow,
    JobRecordProgressParams,
    JobRescueParams,
)
from django_hopper.exceptions import (
    InvalidJob,
    JobFenced,
    JobNotClaimable,
    JobRunning,
    NotFound,
)
from django_hopper.ids import new_id
from django_hopper.types import LEASE_EXPIRED_ERROR, LeaseFence, Progress, RescueReason
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim_one,
    finalize,
    get,
    insert,
    register,
    result,
    running,
)
from tests.factories import QueueFactory

TTL = MINUTE


def leases(engine: BaseEngine) -> BaseEngine:
    return engine


def claim_by_id(
    engine: BaseEngine,
    job: Any,
    now: dt.datetime,
    fence: int | None = None,
    ttl: dt.timedelta = TTL,
) -> JobLeaseRow:
    return leases(engine).job_claim_by_id(
        JobClaimByIDParams(id=job.id, fence=job.fence if fence is None else fence, ttl=ttl, now=now)
    )


def renew(engine: BaseEngine, row: JobLeaseRow, now: dt.datetime) -> Any:
    return leases(engine).job_lease_renew(
        JobLeaseRenewParams(id=row.job.id, lease=row.lease, now=now)
    )


def expire(
    engine: BaseEngine, client_id: int, now: dt.datetime, grace: dt.timedelta = dt.timedelta(0)
) -> list[Any]:
    return leases(engine).job_expire_leases(
        JobExpireLeasesParams(limit=100, client_id=client_id, grace=grace, now=now)
    )


def leased_result(row: JobLeaseRow, state: str, **fields: Any) -> JobFinalize:
    return JobFinalize(
        id=row.job.id,
        attempted_by=None,
        fence=row.lease.fence,
        state=state,
        lease_token=row.lease.token,
        **fields,
    )


# -- claim by ID ----------------------------------------------------------------


def test_claim_by_id__runs_the_job_with_no_client_under_a_new_lease(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, queue="by-id")

    row = claim_by_id(engine, job, db_now)

    assert row.job.state == "running"
    assert row.job.attempted_by is None
    assert (row.job.attempt, row.job.fence) == (1, 1)
    assert row.lease.fence == 1 and isinstance(row.lease.token, uuid.UUID)
    assert row.expires_at == db_now + TTL
    assert get(engine, job).lease_expires_at == db_now + TTL


def test_claim_by_id__tokens_differ_per_claim(engine: BaseEngine, db_now: dt.datetime) -> None:
    a = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    b = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    assert a.lease.token != b.lease.token


def test_claim_by_id__takes_a_scheduled_job_whatever_its_schedule(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, queue="by-id", scheduled_at=db_now + HOUR)

    assert claim_by_id(engine, job, db_now).job.state == "running"


def test_claim_by_id__no_wait_claims_when_nobody_holds_the_row(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, queue="by-id")

    row = engine.job_claim_by_id(
        JobClaimByIDParams(id=job.id, fence=0, ttl=TTL, now=db_now, no_wait=True)
    )

    assert row.job.state == "running" and row.lease.fence == 1
    assert get(engine, job).lease_expires_at == db_now + TTL


def test_claim_by_id__no_wait_refuses_in_the_same_order_as_a_waiting_claim(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, queue="by-id")
    claim_by_id(engine, job, db_now)

    def no_wait(fence: int) -> Any:
        return engine.job_claim_by_id(
            JobClaimByIDParams(id=job.id, fence=fence, ttl=TTL, now=db_now, no_wait=True)
        )

    with pytest.raises(JobFenced):
        no_wait(0)
    with pytest.raises(JobRunning):
        no_wait(1)
    with pytest.raises(NotFound):
        engine.job_claim_by_id(
            JobClaimByIDParams(id=new_id(), fence=0, ttl=TTL, now=db_now, no_wait=True)
        )


def test_claim_by_id__unknown_job_is_not_found(engine: BaseEngine, db_now: dt.datetime) -> None:
    with pytest.raises(NotFound):
        leases(engine).job_claim_by_id(
            JobClaimByIDParams(id=new_id(), fence=0, ttl=TTL, now=db_now)
        )


def test_claim_by_id__a_finished_job_is_not_claimable(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = insert(engine, db_now, queue="by-id")
    claimed = claim_one(engine, client_id, db_now, queue="by-id")
    finalize(engine, db_now, result(claimed, "completed"))

    with pytest.raises(JobNotClaimable):
        claim_by_id(engine, job, db_now, fence=99)  # history first, whatever the fence


def test_claim_by_id__another_fence_is_fenced_running_or_not(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    waiting = insert(engine, db_now, queue="by-id")
    with pytest.raises(JobFenced):
        claim_by_id(engine, waiting, db_now, fence=3)

    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    with pytest.raises(JobFenced):
        claim_by_id(engine, row.job, db_now, fence=0)


def test_claim_by_id__running_at_the_fence_is_running(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    with pytest.raises(JobRunning):
        claim_by_id(engine, row.job, db_now, fence=row.job.fence)


@pytest.mark.parametrize("why", ["pending", "expired", "paused", "ordered"])
def test_claim_by_id__refuses_a_job_that_cannot_run_now(
    engine: BaseEngine, db_now: dt.datetime, why: str
) -> None:
    fields: dict[str, Any] = {"queue": f"by-id-{why}"}
    if why == "expired":
        fields["ttl"] = SECOND
    if why == "ordered":
        fields["ordering_key"] = "k"
        insert(engine, db_now, **fields)  # the key's head
    job = insert(engine, db_now, **fields)
    if why == "pending":
        from django_hopper.models import Job

        Job.objects.filter(id=job.id).update(state="pending")
    if why == "paused":
        QueueFactory(now=db_now, name=fields["queue"], paused=True)

    with pytest.raises(JobNotClaimable):
        claim_by_id(engine, job, db_now + MINUTE)
    assert get(engine, job).state != "running"


def test_claim_by_id__the_head_of_an_ordering_key_is_claimable(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    head = insert(engine, db_now, queue="by-id-key", ordering_key="k")
    insert(engine, db_now, queue="by-id-key", ordering_key="k")

    assert claim_by_id(engine, head, db_now).job.id == head.id


def test_claim_by_id__ttl_below_a_microsecond_is_refused(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    with pytest.raises(InvalidJob):
        claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now, ttl=dt.timedelta(0))


def test_claim__a_client_claim_of_a_queue_skips_a_leased_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = insert(engine, db_now, queue="by-id")
    claim_by_id(engine, job, db_now)

    from tests.engine_conformance.support import claim

    assert claim(engine, client_id, db_now, queue="by-id") == []


# -- renewal -----------------------------------------------------------------------


def test_lease_renew__extends_by_the_ttl_from_now_and_reports_cancel(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    status = renew(engine, row, db_now + 10 * SECOND)
    assert status.expires_at == db_now + 10 * SECOND + TTL
    assert status.cancel_requested is False

    engine.job_cancel(JobCancelParams(id=row.job.id, now=db_now))
    assert renew(engine, row, db_now + 20 * SECOND).cancel_requested is True


def test_lease_renew__succeeds_past_the_expiry_until_an_expiry_is_applied(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    late = db_now + 2 * TTL
    assert renew(engine, row, late).expires_at == late + TTL

    expire(engine, client_id, late + 2 * TTL)
    with pytest.raises(JobFenced):
        renew(engine, row, late + 2 * TTL)


def test_lease_renew__a_wrong_token_or_fence_is_fenced(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    for lease in (LeaseFence(new_id(), row.lease.fence), LeaseFence(row.lease.token, 7)):
        with pytest.raises(JobFenced):
            leases(engine).job_lease_renew(
                JobLeaseRenewParams(id=row.job.id, lease=lease, now=db_now)
            )


def test_lease_renew__fenced_after_the_attempt_ended(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    finalize(engine, db_now, leased_result(row, "completed"))

    with pytest.raises(JobFenced):
        renew(engine, row, db_now)


# -- finalize and progress fenced to the lease --------------------------------------


def test_finalize__a_leased_result_applies_only_with_its_token(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    stranger = JobFinalize(
        id=row.job.id,
        attempted_by=None,
        fence=row.lease.fence,
        state="completed",
        lease_token=new_id(),
    )
    as_client = JobFinalize(
        id=row.job.id, attempted_by=client_id, fence=row.lease.fence, state="completed"
    )

    assert finalize(engine, db_now, stranger) == []
    assert finalize(engine, db_now, as_client) == []
    applied = finalize(engine, db_now, leased_result(row, "completed", output={"ok": 1}))

    assert [f.id for f in applied] == [row.job.id]
    done = get(engine, row.job)
    assert done.state == "completed" and done.output == {"ok": 1}


def test_finalize__a_leased_retry_clears_the_lease(engine: BaseEngine, db_now: dt.datetime) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    finalize(engine, db_now, leased_result(row, "retryable", delay=SECOND))

    job = get(engine, row.job)
    assert job.state == "retryable" and job.lease_expires_at is None
    again = claim_by_id(engine, job, db_now)
    assert again.lease.fence == 2 and again.lease.token != row.lease.token


def test_progress__a_leased_attempt_records_with_its_token_only(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    def record(token: Any) -> Progress | None:
        return engine.job_record_progress(
            JobRecordProgressParams(
                id=row.job.id,
                attempted_by=None,
                fence=row.lease.fence,
                attempt=row.job.attempt,
                lease_token=token,
                step="s",
                cursor=1,
                now=db_now,
            )
        )

    assert record(new_id()) is None
    assert record(row.lease.token) == Progress("s", 1, db_now)


def test_progress__a_leased_attempt_keeps_its_step_with_keep_step_and_no_wait(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    claim = {
        "id": row.job.id,
        "attempted_by": None,
        "fence": row.lease.fence,
        "attempt": row.job.attempt,
        "lease_token": row.lease.token,
    }
    engine.job_record_progress(JobRecordProgressParams(step="copy", cursor=1, now=db_now, **claim))

    stored = engine.job_record_progress(
        JobRecordProgressParams(keep_step=True, no_wait=True, cursor=2, now=db_now, **claim)
    )

    assert stored == Progress("copy", 2, db_now)
    assert get(engine, row.job).progress == stored


# -- expiry ------------------------------------------------------------------------------


def test_expire_leases__a_due_lease_is_retryable_at_once_with_a_rescue_entry(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id", max_attempts=3), db_now)

    assert expire(engine, client_id, db_now + TTL - SECOND) == []
    (job,) = expire(engine, client_id, db_now + TTL)

    assert job.id == row.job.id and job.state == "retryable"
    assert job.scheduled_at == db_now + TTL
    assert job.lease_expires_at is None
    (err,) = job.errors
    assert (err.rescue, err.error, err.fence, err.attempt) == (
        RescueReason.LEASE_EXPIRED,
        LEASE_EXPIRED_ERROR,
        1,
        1,
    )
    with pytest.raises(JobFenced):
        renew(engine, row, db_now + TTL)


def test_expire_leases__discards_on_the_last_attempt_and_cancels_on_request(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    last = claim_by_id(engine, insert(engine, db_now, queue="by-id", max_attempts=1), db_now)
    asked = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    engine.job_cancel(JobCancelParams(id=asked.job.id, now=db_now))

    jobs = {j.id: j for j in expire(engine, client_id, db_now + TTL)}

    assert jobs[last.job.id].state == "discarded"
    assert jobs[asked.job.id].state == "canceled"


def test_expire_leases__expires_nothing_unless_the_expiring_client_is_live(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    short = register(engine, db_now, ttl=SECOND)
    claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)

    assert expire(engine, short, db_now + TTL) == []
    assert expire(engine, 987654321, db_now + TTL) == []


def test_expire_leases__a_client_started_after_the_renewal_grants_a_grace(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    started = db_now + 50 * SECOND  # after the lease's last renewal, before its expiry
    leader = register(engine, started, ttl=HOUR)
    grace = 5 * MINUTE

    # Due at the first such start plus the larger of the TTL and the grace.
    assert expire(engine, leader, db_now + TTL, grace=grace) == []
    assert expire(engine, leader, started + grace - SECOND, grace=grace) == []
    (job,) = expire(engine, leader, started + grace, grace=grace)
    assert job.id == row.job.id

    # Without a grace, the lease's own TTL counts from that start.
    row2 = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    assert expire(engine, leader, started + TTL - SECOND) == []
    assert [j.id for j in expire(engine, leader, started + TTL)] == [row2.job.id]


def test_expire_leases__a_client_started_past_the_expiry_plus_the_grace_grants_none(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    grace = 5 * MINUTE
    late = db_now + TTL + grace + SECOND  # the holder had its expiry plus the grace
    cron = register(engine, late, ttl=MINUTE)

    (job,) = expire(engine, cron, late, grace=grace)
    assert job.id == row.job.id


def test_expire_leases__clients_that_keep_starting_never_hold_a_dead_lease_up(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    """Each cron run of a maintenance pass is a client that starts, runs and dies: the
    lease is due by its expiry plus the grace plus the larger of TTL and grace."""
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    grace = 2 * MINUTE
    bound = db_now + TTL + grace + max(TTL, grace)
    at = db_now + 30 * SECOND
    expired: list[dt.datetime] = []
    while at <= bound + MINUTE and not expired:
        run = register(engine, at, ttl=20 * SECOND)  # one cron run's client
        if expire(engine, run, at, grace=grace):
            expired.append(at)
        at += 20 * SECOND

    assert expired and expired[0] <= bound
    assert get(engine, row.job.id).state == "retryable"


def test_expire_leases__a_renewal_after_a_clients_start_drops_its_grace(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now)
    leader = register(engine, db_now + SECOND, ttl=HOUR)
    renew(engine, row, db_now + 2 * SECOND)

    (job,) = expire(engine, leader, db_now + 2 * SECOND + TTL, grace=HOUR)
    assert job.id == row.job.id


def test_expire_leases__leaves_client_claims_alone(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now, queue="by-id")
    claimed = claim_one(engine, client_id, db_now, queue="by-id")

    assert expire(engine, client_id, db_now + HOUR - SECOND) == []
    assert get(engine, claimed).state == "running"


def test_rescue_candidates__a_leased_job_past_stuck_after_is_never_a_stuck_candidate(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    """Its lease governs it: a finalize fenced to a client claim could never end it, so
    as a candidate it would come back every pass and take a place of the limit."""
    row = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now, ttl=HOUR)
    renew(engine, row, db_now + 50 * MINUTE)  # alive, renewing, running for long

    found = engine.job_rescue_candidates(
        JobRescueParams(stuck_after=MINUTE, limit=10, now=db_now + 55 * MINUTE)
    )

    assert found == []


def test_rescue_candidates__leased_jobs_never_take_the_limit_from_rescuable_ones(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    for _ in range(3):  # claimed first: oldest, and first in claim order
        claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now, ttl=HOUR)
    client = register(engine, db_now, ttl=HOUR)
    stuck = running(engine, client, db_now + SECOND)

    found = engine.job_rescue_candidates(
        JobRescueParams(stuck_after=MINUTE, limit=1, now=db_now + 10 * MINUTE)
    )

    assert [(c.job.id, c.stuck) for c in found] == [(stuck.id, True)]


def test_rescuer__ends_a_stuck_job_and_leaves_a_long_leased_pass_to_its_lease(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    from django_hopper.maintenance import Rescuer

    leased = claim_by_id(engine, insert(engine, db_now, queue="by-id"), db_now, ttl=HOUR)
    client = register(engine, db_now, ttl=HOUR)
    stuck = running(engine, client, db_now + SECOND)
    later = db_now + 10 * MINUTE

    assert Rescuer(engine, stuck_after=60).run_once(now=later) == 1
    assert Rescuer(engine, stuck_after=60).run_once(now=later) == 0  # nothing comes back

    assert get(engine, stuck).state == "retryable"
    assert get(engine, leased.job).state == "running"
