"""job_record_progress: fenced like a finalize (client, fence and attempt), keep_step."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobRecordProgressParams
from django_hopper.ids import new_id
from django_hopper.types import JobRow, Progress
from tests.engine_conformance.support import (
    MINUTE,
    SECOND,
    claim_one,
    finalize,
    get,
    insert,
    result,
    running,
)
from tests.factories import JobFactory


def record(engine: BaseEngine, job: JobRow, now: dt.datetime, **fields: Any) -> Progress | None:
    """Record progress as the attempt that claimed ``job`` (fields override)."""
    values: dict[str, Any] = {
        "id": job.id,
        "attempted_by": job.attempted_by,
        "fence": job.fence,
        "attempt": job.attempt,
        "now": now,
    }
    values.update(fields)
    return engine.job_record_progress(JobRecordProgressParams(**values))


def test_progress__stores_step_cursor_and_time(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    at = db_now + SECOND

    stored = record(engine, job, at, step="download", cursor={"page": 3, "seen": ["a", "b"]})

    expected = Progress(step="download", cursor={"page": 3, "seen": ["a", "b"]}, recorded_at=at)
    assert stored == expected
    assert get(engine, job).progress == expected


def test_progress__the_latest_record_replaces_the_earlier_one(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, db_now, step="one", cursor=1)

    record(engine, job, db_now + SECOND, step="two", cursor=2)

    assert get(engine, job).progress == Progress("two", 2, db_now + SECOND)


def test_progress__keep_step_keeps_the_stored_step_and_takes_the_new_cursor(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, db_now, step="parse", cursor=10)

    stored = record(engine, job, db_now + SECOND, step="ignored", keep_step=True, cursor=20)

    assert stored == Progress("parse", 20, db_now + SECOND)
    assert get(engine, job).progress == stored


def test_progress__keep_step_before_any_step_stores_an_empty_step(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    stored = record(engine, job, db_now, step="ignored", keep_step=True, cursor="c")

    assert stored == Progress("", "c", db_now)


def test_progress__a_null_cursor_clears_the_cursor(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, db_now, step="a", cursor={"x": 1})

    stored = record(engine, job, db_now, step="b", cursor=None)

    assert stored == Progress("b", None, db_now)
    assert get(engine, job).progress == Progress("b", None, db_now)


def test_progress__refuses_a_stale_fence(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    record(engine, first, db_now, step="first")
    # A snooze gives the attempt back, so only the fence tells the claims apart.
    finalize(engine, db_now, result(first, "scheduled", snooze=True))
    second = claim_one(engine, client_id, db_now + SECOND)
    assert second.attempt == first.attempt

    assert record(engine, first, db_now + SECOND, step="stale") is None
    assert get(engine, second).progress == Progress("first", None, db_now)


def test_progress__refuses_another_client(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    assert record(engine, job, db_now, step="x", attempted_by=other_client_id) is None
    assert get(engine, job).progress is None


def test_progress__refuses_another_attempt_number(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    assert record(engine, job, db_now, step="x", attempt=job.attempt + 1) is None
    assert get(engine, job).progress is None


def test_progress__refuses_a_job_that_is_no_longer_running(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "retryable", delay=MINUTE))

    assert record(engine, job, db_now, step="late") is None
    assert get(engine, job).progress is None


def test_progress__refuses_a_finalized_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "completed"))

    assert record(engine, job, db_now, step="late") is None
    assert get(engine, job).progress is None


def test_progress__refuses_an_unknown_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    assert record(engine, job, db_now, id=new_id(), step="x") is None


def test_progress__survives_a_retry_and_a_snooze(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    record(engine, first, db_now, step="half", cursor=50)
    finalize(engine, db_now, result(first, "retryable"))
    second = claim_one(engine, client_id, db_now)
    assert second.progress == Progress("half", 50, db_now)
    finalize(engine, db_now, result(second, "scheduled", snooze=True))

    third = claim_one(engine, client_id, db_now)

    assert third.progress == Progress("half", 50, db_now)


def test_progress__survives_the_move_to_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, db_now, step="last")

    finalize(engine, db_now, result(job, "discarded"))

    assert get(engine, job).progress == Progress("last", None, db_now)


def test_progress__a_leased_job_accepts_only_its_lease_token(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = JobFactory(now=db_now, leased=True)
    params = {"id": job.id, "fence": 1, "attempt": 1, "now": db_now}

    wrong = engine.job_record_progress(
        JobRecordProgressParams(attempted_by=None, lease_token=new_id(), step="x", **params)
    )
    by_client = engine.job_record_progress(
        JobRecordProgressParams(attempted_by=client_id, step="x", **params)
    )
    right = engine.job_record_progress(
        JobRecordProgressParams(attempted_by=None, lease_token=job.lease_token, step="ok", **params)
    )

    assert wrong is None
    assert by_client is None
    assert right == Progress("ok", None, db_now)


def test_progress__no_wait_records_when_nobody_holds_the_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    assert record(engine, job, db_now, step="fast", no_wait=True) == Progress("fast", None, db_now)


def test_progress__no_wait_with_keep_step_keeps_the_step_and_takes_the_cursor(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    record(engine, job, db_now, step="load", cursor=1)

    stored = record(engine, job, db_now + SECOND, keep_step=True, no_wait=True, cursor=2)

    assert stored == Progress("load", 2, db_now + SECOND)
    assert get(engine, job).progress == stored


def test_progress__no_wait_returns_none_for_an_attempt_that_lost_the_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "retryable"))

    assert record(engine, job, db_now, step="late", no_wait=True) is None
    assert record(engine, job, db_now, keep_step=True, no_wait=True) is None
    assert get(engine, job).progress is None
