"""The public job-lease API: take a job by ID, renew, expire, and finalize it in
the caller's transaction (``lease_job``, ``claim_job``, ``resume_lease``).

Committed data throughout (``tx_engine``): what a lease does outside a
transaction and what a rollback undoes are the point.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Any

import pytest
from django.db import connection, transaction

import django_hopper as hopper
from django_hopper import signals
from django_hopper.conf import hopper_settings
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import ClientRegisterParams, JobClaimParams
from django_hopper.exceptions import (
    InvalidJob,
    JobCanceled,
    JobFenced,
    JobLocked,
    JobNotClaimable,
    JobRunning,
    NotFound,
)
from django_hopper.ids import new_id
from django_hopper.maintenance.services import LeaseExpirer
from django_hopper.types import LEASE_EXPIRED_ERROR, JobRow, RescueReason
from tests.engine_conformance.test_concurrency import row_held
from tests.testapp import jobs
from tests.testapp.models import Effect

HOUR = dt.timedelta(hours=1)


class Rollback(Exception):
    """Raised to roll the caller's transaction back."""


def enqueue(**kwargs: Any) -> JobRow:
    return (
        jobs.add.using(queue="leased", max_attempts=kwargs.pop("max_attempts", 3))
        .enqueue(a=1, b=2)
        .job
    )


def get(engine: BaseEngine, job: JobRow) -> JobRow:
    row = engine.job_get(job.id)
    assert row is not None
    return row


def unchanged(engine: BaseEngine, job: JobRow) -> bool:
    """Return whether ``job`` is exactly as enqueued: waiting, never claimed."""
    row = get(engine, job)
    return (row.state, row.attempt, row.fence, row.errors, row.lease_expires_at) == (
        "available",
        0,
        0,
        [],
        None,
    )


# -- finalize in the caller's transaction ------------------------------------------


def test_lease_job__completes_the_job_with_the_callers_rows_in_one_transaction(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()

    with transaction.atomic(), hopper.lease_job(job.id) as lease:
        Effect.objects.create(job_id=job.id, fence=lease.fence, note="caller")
        lease.complete({"sum": 3})

    row = get(tx_engine, job)
    assert (row.state, row.output, row.attempt, row.fence) == ("completed", {"sum": 3}, 1, 1)
    assert Effect.objects.get(job_id=job.id).fence == row.fence
    assert lease.outcome == "completed"


def test_lease_job__a_rollback_of_the_callers_transaction_leaves_the_job_as_it_was(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()

    with pytest.raises(Rollback), transaction.atomic():
        with hopper.lease_job(job.id) as lease:
            Effect.objects.create(job_id=job.id, fence=lease.fence, note="caller")
            lease.complete({"sum": 3})
        raise Rollback

    assert unchanged(tx_engine, job)
    assert not Effect.objects.exists()
    assert lease.outcome is None


def test_lease_job__an_exception_in_a_transaction_undoes_the_claim_and_the_blocks_rows(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()

    with transaction.atomic():
        Effect.objects.create(job_id=job.id, note="before")
        with pytest.raises(Rollback), hopper.lease_job(job.id) as lease:
            Effect.objects.create(job_id=job.id, fence=lease.fence, note="inside")
            raise Rollback

    assert unchanged(tx_engine, job)
    assert list(Effect.objects.values_list("note", flat=True)) == ["before"]


def test_lease_job__a_worker_claim_meanwhile_never_sees_the_uncommitted_lease(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()
    client = tx_engine.client_register(
        ClientRegisterParams(hostname="w", ttl=dt.timedelta(hours=1))
    )

    with transaction.atomic(), hopper.lease_job(job.id) as lease:
        lease.complete(None)
        # Another connection (a worker) claims the queue while the lease is uncommitted.
        seen = _claim_in_thread(tx_engine, client)

    assert seen == ([] if tx_engine.features.supports_skip_locked else None)
    assert get(tx_engine, job).state == "completed"
    assert tx_engine.job_claim(JobClaimParams(queue="leased", client_id=client, limit=5)).jobs == []


def _claim_in_thread(engine: BaseEngine, client: int) -> list[Any] | None:
    """Claim the queue from another thread's connection; None if it could not get the
    write lock (a single-writer engine while the caller's transaction writes)."""
    out: list[Any] = []

    def claim() -> None:
        try:
            with connection.cursor() as c:
                if engine.features.single_writer:
                    c.execute("PRAGMA busy_timeout = 50")
            out.append([j.id for j in engine.job_claim(JobClaimParams("leased", client, 5)).jobs])
        except Exception:
            out.append(None)
        finally:
            connection.close()

    thread = threading.Thread(target=claim)
    thread.start()
    thread.join(30)
    return out[0]


# -- outcomes outside a transaction --------------------------------------------------


def test_lease_job__outside_a_transaction_an_exception_fails_the_attempt_with_its_error(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()

    with pytest.raises(ValueError), hopper.lease_job(job.id):
        raise ValueError("no stock")

    row = get(tx_engine, job)
    assert (row.state, row.attempt) == ("retryable", 1)
    assert row.errors[-1].error == "ValueError: no stock"
    assert row.errors[-1].fence == 1 and "no stock" in row.errors[-1].trace


def test_lease_job__an_exception_on_the_last_attempt_discards_the_job(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue(max_attempts=1)

    with pytest.raises(ValueError), hopper.lease_job(job.id):
        raise ValueError("no stock")

    assert get(tx_engine, job).state == "discarded"


def test_lease_job__job_canceled_in_the_block_cancels_the_job(tx_engine: BaseEngine) -> None:
    job = enqueue()

    with pytest.raises(JobCanceled), hopper.lease_job(job.id):
        raise JobCanceled("operator said stop")

    assert get(tx_engine, job).state == "canceled"


def test_lease_job__a_clean_exit_without_an_outcome_releases_the_job_and_says_so(
    tx_engine: BaseEngine, caplog: pytest.LogCaptureFixture
) -> None:
    job = enqueue()

    with caplog.at_level(logging.WARNING, "django_hopper.leases"), hopper.lease_job(job.id):
        pass

    row = get(tx_engine, job)
    assert (row.state, row.attempt, row.fence, row.errors) == ("scheduled", 0, 1, [])
    assert row.scheduled_at <= tx_engine.now()
    assert "ended without an outcome" in caplog.text


def test_lease_job__a_snooze_or_a_failure_is_the_holders_choice(tx_engine: BaseEngine) -> None:
    first, second = enqueue(), enqueue()

    with hopper.lease_job(first.id) as lease:
        lease.snooze(3600, "supplier closed")
    with hopper.lease_job(second.id) as lease:
        lease.log("checked the supplier")
        lease.fail("supplier gone", discard=True)

    snoozed, failed = get(tx_engine, first), get(tx_engine, second)
    assert (snoozed.state, snoozed.attempt, snoozed.snooze_reason) == (
        "scheduled",
        0,
        "supplier closed",
    )
    assert (failed.state, failed.errors[-1].error) == ("discarded", "supplier gone")
    assert [log.log for log in hopper.job_logs(second.id)] == ["checked the supplier\n"]


def test_lease__an_outcome_refused_for_bad_output_writes_nothing(tx_engine: BaseEngine) -> None:
    job = enqueue()
    lease = hopper.claim_job(job.id)

    with pytest.raises(InvalidJob) as info:
        lease.complete({"when": dt.datetime(2030, 1, 1)})

    assert info.value.field == "output['when']"
    assert get(tx_engine, job).state == "running"
    lease.complete({"when": "2030-01-01"})
    assert get(tx_engine, job).state == "completed"


# -- taking the job: waits, refusals, fences ---------------------------------------


def test_claim_job__nowait_raises_and_skip_locked_returns_none_while_a_transaction_holds_it(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()

    with row_held(job):
        with pytest.raises(JobLocked):
            hopper.claim_job(job.id, nowait=True)
        assert hopper.claim_job(job.id, skip_locked=True) is None
        with hopper.lease_job(job.id, skip_locked=True) as nothing:
            assert nothing is None

    assert unchanged(tx_engine, job)
    assert hopper.claim_job(job.id, skip_locked=True) is not None


def test_claim_job__a_job_a_worker_runs_is_refused_as_running(tx_engine: BaseEngine) -> None:
    job = enqueue()
    client = tx_engine.client_register(
        ClientRegisterParams(hostname="w", ttl=dt.timedelta(hours=1))
    )
    tx_engine.job_claim(JobClaimParams(queue="leased", client_id=client, limit=1))

    with pytest.raises(JobRunning):
        hopper.claim_job(job.id)
    with pytest.raises(JobRunning), hopper.lease_job(job.id, nowait=True):
        pass


def test_claim_job__a_pinned_fence_refuses_a_job_claimed_since(tx_engine: BaseEngine) -> None:
    job = enqueue()
    with hopper.lease_job(job.id) as lease:
        lease.fail("try again")

    with pytest.raises(JobFenced):
        hopper.claim_job(job.id, fence=0)
    assert hopper.claim_job(job.id, fence=1).fence == 2


def test_claim_job__finished_and_unknown_jobs_are_refused(tx_engine: BaseEngine) -> None:
    job = enqueue()
    with hopper.lease_job(job.id) as lease:
        lease.complete(3)

    with pytest.raises(JobNotClaimable):
        hopper.claim_job(job.id)
    with pytest.raises(NotFound):
        hopper.claim_job(new_id())


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("lease", {"lease": 0.5}),
        ("lease", {"lease": 0}),
        ("lease", {"lease": dt.timedelta(milliseconds=10)}),
        ("skip_locked", {"nowait": True, "skip_locked": True}),
        ("nowait", {"nowait": 1}),
        ("fence", {"fence": -1}),
        ("job_id", {"job_id": "not-a-uuid"}),
        ("using", {"using": "no-such-alias"}),
    ],
)
def test_claim_job__refuses_bad_arguments_before_touching_the_job(
    tx_engine: BaseEngine, field: str, kwargs: dict[str, Any]
) -> None:
    job = enqueue()
    job_id = kwargs.pop("job_id", job.id)

    with pytest.raises(InvalidJob) as info:
        hopper.claim_job(job_id, **kwargs)

    assert info.value.field == field
    assert unchanged(tx_engine, job)


# -- a durable lease: renewal, expiry with grace, the fenced late holder ------------


def test_lease__renew_extends_the_lease_and_reports_a_cancel_request(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()
    lease = hopper.claim_job(job.id, lease=60)
    first = lease.expires_at

    hopper.cancel_job(job.id)
    renewed = lease.renew()

    assert renewed >= first and lease.expires_at == renewed
    assert lease.cancel_requested
    lease.cancel()
    assert get(tx_engine, job).state == "canceled"


def test_lease__an_expired_lease_is_ended_by_the_expirer_and_the_late_holder_is_fenced(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()
    lease = hopper.claim_job(job.id, lease=1)
    leader = tx_engine.client_register(ClientRegisterParams(hostname="l", ttl=dt.timedelta(days=1)))
    started = tx_engine.now()
    expirer = LeaseExpirer(tx_engine, lambda: leader)
    grace = dt.timedelta(
        seconds=max(float(hopper_settings.CLIENT_TTL), float(hopper_settings.LEADER_TTL))
    )

    # A client started after the lease's last renewal (an outage, a deploy): the
    # holder gets the grace past that start to renew before its lease is due.
    assert expirer.run_once(now=lease.expires_at + dt.timedelta(seconds=1)) == 0
    assert expirer.run_once(now=started + grace + dt.timedelta(seconds=1)) == 1

    row = get(tx_engine, job)
    assert (row.state, row.errors[-1].rescue) == ("retryable", RescueReason.LEASE_EXPIRED)
    assert row.errors[-1].error == LEASE_EXPIRED_ERROR
    with pytest.raises(JobFenced), transaction.atomic():
        Effect.objects.create(job_id=job.id, fence=lease.fence, note="late holder")
        lease.complete(3)
    assert not Effect.objects.exists()
    with pytest.raises(JobFenced):
        lease.renew()
    assert get(tx_engine, job).state == "retryable"


def test_resume_lease__continues_a_lease_in_another_request_with_its_token_and_fence(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()
    lease = hopper.claim_job(job.id, lease=60)
    lease.record_progress("reserved", {"items": 2})

    again = hopper.resume_lease(str(job.id), token=str(lease.token), fence=lease.fence)
    again.record_progress(cursor={"items": 3}, keep_step=True)
    again.complete("done")

    row = get(tx_engine, job)
    assert row.state == "completed" and row.progress is not None
    assert (row.progress.step, row.progress.cursor) == ("reserved", {"items": 3})
    with pytest.raises(JobFenced):
        hopper.resume_lease(job.id, token=new_id(), fence=lease.fence)


def test_lease__record_progress_takes_a_step_or_keep_step_never_both_nor_neither(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()
    lease = hopper.claim_job(job.id)

    with pytest.raises(InvalidJob):
        lease.record_progress(cursor=1)
    with pytest.raises(InvalidJob):
        lease.record_progress("step", 1, keep_step=True)
    stored = lease.record_progress("step", 1, no_wait=True)

    assert (stored.step, stored.cursor) == ("step", 1)
    with row_held(job), pytest.raises(JobLocked):
        lease.record_progress(cursor=2, keep_step=True, no_wait=True)
    assert get(tx_engine, job).progress == stored


def test_lease__record_progress_refuses_a_job_whose_progress_is_a_resumable_runs_cursor(
    tx_engine: BaseEngine,
) -> None:
    job = enqueue()
    first = hopper.claim_job(job.id)
    first.record_progress("pass", "a step named pass is a plain step")  # not a run's shape
    committed = {"cursor": 7, "counters": {"pages": 7}, "passes": 7}
    first.record_progress("pass", committed)  # what a run's committed pass stores
    first.release()
    lease = hopper.claim_job(job.id)  # a request that never imported the run's module

    with pytest.raises(InvalidJob, match="resumable run") as refused:
        lease.record_progress("page", 8)

    assert refused.value.field == "progress"
    stored = get(tx_engine, job).progress
    assert stored is not None and (stored.step, stored.cursor) == ("pass", committed)


# -- announcements and the read-then-claim race -----------------------------------


def test_lease__a_final_outcome_is_announced_once_it_commits_never_on_rollback(
    tx_engine: BaseEngine,
) -> None:
    ended: list[JobRow] = []

    def receiver(sender: Any, jobs: list[JobRow], **kwargs: Any) -> None:
        ended.extend(jobs)

    kept, rolled_back = enqueue(), enqueue()
    signals.jobs_ended.connect(receiver)
    try:
        with pytest.raises(Rollback), transaction.atomic():
            with hopper.lease_job(rolled_back.id) as lease:
                lease.complete(1)
            raise Rollback
        with transaction.atomic():
            with hopper.lease_job(kept.id) as lease:
                lease.complete(2)
            assert ended == []  # not before the commit
    finally:
        signals.jobs_ended.disconnect(receiver)

    assert [(j.id, j.state, j.output) for j in ended] == [(kept.id, "completed", 2)]


def test_claim_job__a_job_claimed_and_ended_between_the_read_and_the_claim_is_read_again(
    tx_engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = enqueue()
    stale = get(tx_engine, job)
    with hopper.lease_job(job.id) as lease:  # another party's attempt, between read and claim
        lease.fail("try again")
    reads: list[int] = []
    real_get = type(tx_engine).job_get

    def first_read_stale(self: BaseEngine, id: Any) -> JobRow | None:
        reads.append(1)
        return stale if len(reads) == 1 else real_get(self, id)

    monkeypatch.setattr(type(tx_engine), "job_get", first_read_stale)

    lease = hopper.claim_job(job.id)

    assert len(reads) == 2 and lease.fence == 2 and lease.attempt == 2
