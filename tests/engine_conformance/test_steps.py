"""The step ledger: reads, records and clears fenced to the claim (client or lease),
a lease renewed at each step boundary, results kept once recorded."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobClaimByIDParams,
    JobLeaseRow,
    JobStepGetParams,
    JobStepRecordParams,
    JobStepsClearParams,
)
from django_hopper.exceptions import InvalidJob, JobFenced
from django_hopper.types import JobRow
from tests.engine_conformance.support import (
    MINUTE,
    SECOND,
    finalize,
    get,
    insert,
    result,
    running,
)


def ledger(engine: BaseEngine) -> BaseEngine:
    return engine


def claim_fields(job: JobRow, lease: JobLeaseRow | None = None) -> dict[str, Any]:
    if lease is not None:
        return {
            "id": job.id,
            "attempted_by": None,
            "fence": lease.lease.fence,
            "lease_token": lease.lease.token,
        }
    return {"id": job.id, "attempted_by": job.attempted_by, "fence": job.fence}


def step_get(engine: BaseEngine, job: JobRow, step: str, now: dt.datetime, **kw: Any) -> Any:
    return ledger(engine).job_step_get(
        JobStepGetParams(step=step, now=now, **{**claim_fields(job), **kw})
    )


def record(engine: BaseEngine, job: JobRow, step: str, now: dt.datetime, **kw: Any) -> Any:
    fields = {**claim_fields(job), "done": True, **kw}
    return ledger(engine).job_step_record(JobStepRecordParams(step=step, now=now, **fields))


def clear(engine: BaseEngine, job: JobRow, now: dt.datetime, **kw: Any) -> int:
    return ledger(engine).job_steps_clear(
        JobStepsClearParams(now=now, **{**claim_fields(job), **kw})
    )


def test_steps__an_untried_step_reads_as_none(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    assert step_get(engine, job, "fetch", db_now) is None


def test_steps__a_recorded_result_round_trips_including_null(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    row = record(engine, job, "fetch", db_now, result={"rows": [1, 2], "next": "b"})
    record(engine, job, "nothing", db_now, result=None)

    assert (row.done, row.result, row.attempts) == (True, {"rows": [1, 2], "next": "b"}, 1)
    got = step_get(engine, job, "fetch", db_now + SECOND)
    assert got.done and got.result == {"rows": [1, 2], "next": "b"}
    assert got.recorded_at == db_now
    nothing = step_get(engine, job, "nothing", db_now)
    assert nothing.done and nothing.result is None


def test_steps__failed_tries_count_and_keep_the_error_until_the_result(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    record(engine, job, "load", db_now, done=False, error="boom 1")
    failed = record(engine, job, "load", db_now, done=False, error="boom 2")
    assert (failed.done, failed.attempts, failed.last_error) == (False, 2, "boom 2")

    ok = record(engine, job, "load", db_now, result=7)
    assert (ok.done, ok.result, ok.attempts, ok.last_error) == (True, 7, 3, "boom 2")


def test_steps__a_stored_result_is_kept(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, "s", db_now, result="first")

    again = record(engine, job, "s", db_now, result="second")

    assert again.result == "first"


def test_steps__ledger_lists_in_first_try_order(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    for name in ("b", "a", "c"):
        record(engine, job, name, db_now, result=name)

    assert [s.step for s in ledger(engine).job_steps(job.id)] == ["b", "a", "c"]


def test_steps__a_stale_claim_reads_and_writes_nothing(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, "kept", db_now, result=1)

    for kw in ({"fence": job.fence + 1}, {"attempted_by": other_client_id}):
        with pytest.raises(JobFenced):
            step_get(engine, job, "kept", db_now, **kw)
        with pytest.raises(JobFenced):
            record(engine, job, "new", db_now, result=2, **kw)
        with pytest.raises(JobFenced):
            clear(engine, job, db_now, **kw)

    assert [s.step for s in ledger(engine).job_steps(job.id)] == ["kept"]


def test_steps__a_finished_attempt_can_no_longer_write_but_its_ledger_stays(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, max_attempts=1)
    record(engine, job, "kept", db_now, result=1)
    finalize(engine, db_now, result(job, "discarded"))

    with pytest.raises(JobFenced):
        record(engine, job, "late", db_now, result=2)
    assert [s.step for s in ledger(engine).job_steps(job.id)] == ["kept"]


def test_steps__clear_drops_the_ledger_as_the_owning_claim(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, "a", db_now, result=1)
    record(engine, job, "b", db_now, done=False, error="x")

    assert clear(engine, job, db_now) == 2
    assert ledger(engine).job_steps(job.id) == []
    assert get(engine, job).attempt == job.attempt


def test_steps__clear_with_reset_attempt_sets_the_attempt_to_one(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "retryable"))
    from tests.engine_conformance.support import claim_one

    again = claim_one(engine, client_id, db_now, queue=job.queue)
    assert again.attempt == 2

    clear(engine, again, db_now, reset_attempt=True)
    assert get(engine, again).attempt == 1
    finalize(engine, db_now, result(again, "scheduled", snooze=True))
    assert get(engine, again).attempt == 0


def test_steps__a_step_boundary_renews_a_lease(engine: BaseEngine, db_now: dt.datetime) -> None:
    job = insert(engine, db_now, queue="steps-lease")
    lease = ledger(engine).job_claim_by_id(
        JobClaimByIDParams(id=job.id, fence=0, ttl=MINUTE, now=db_now)
    )
    fields = claim_fields(lease.job, lease)

    ledger(engine).job_step_get(JobStepGetParams(step="a", now=db_now + SECOND, **fields))
    assert get(engine, job).lease_expires_at == db_now + SECOND + MINUTE

    ledger(engine).job_step_record(
        JobStepRecordParams(step="a", done=True, result=1, now=db_now + 2 * SECOND, **fields)
    )
    assert get(engine, job).lease_expires_at == db_now + 2 * SECOND + MINUTE

    stale = {**fields, "lease_token": job.id}
    with pytest.raises(JobFenced):
        ledger(engine).job_step_get(JobStepGetParams(step="a", now=db_now, **stale))
    assert ledger(engine).job_steps_clear(JobStepsClearParams(now=db_now, **fields)) == 1


def test_steps__an_empty_step_name_is_refused(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    with pytest.raises(InvalidJob):
        record(engine, job, "", db_now, result=1)
