"""Batches: progress recorded by finalizes, folded by batch_settle, callbacks once."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    BatchInsertParams,
    BatchSettleParams,
    JobInsertParams,
    JobListParams,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.models import Batch
from tests.engine_conformance.support import claim, finalize, insert_many, result

CALLBACK = "tests.batch_callback"


def make_batch(engine: BaseEngine, now: dt.datetime, n: int, queue: str = "bq") -> tuple:
    batch_id = engine.batch_insert(
        BatchInsertParams(
            total=n,
            on_success=JobInsertParams(kind=CALLBACK, queue="cb", metadata={"on": "success"}),
            on_failure=JobInsertParams(kind=CALLBACK, queue="cb", metadata={"on": "failure"}),
            on_complete=JobInsertParams(kind=CALLBACK, queue="cb", metadata={"on": "complete"}),
            metadata={"purpose": "test"},
            now=now,
        )
    )
    jobs = [
        r.job
        for r in insert_many(
            engine,
            [JobInsertParams(kind="tests.job", queue=queue, batch_id=batch_id) for _ in range(n)],
            now,
        )
    ]
    return batch_id, jobs


def callbacks(engine: BaseEngine) -> list:
    return engine.job_list(JobListParams(kinds=(CALLBACK,), limit=100))


def test_batch_insert__starts_with_every_job_pending(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    batch_id, _ = make_batch(engine, db_now, 3)

    batch = engine.batch_get(batch_id)

    assert batch is not None
    assert (batch.total, batch.pending, batch.failed, batch.completed_at) == (3, 3, 0, None)
    assert batch.metadata == {"purpose": "test"}


def test_batch_insert__refuses_a_negative_total_writing_nothing(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob, match="total"):
        engine.batch_insert(BatchInsertParams(total=-1))
    assert Batch.objects.count() == 0


def test_job_insert_many__refuses_a_batch_job_with_a_unique_key_writing_nothing(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    batch_id, _ = make_batch(engine, db_now, 0)
    params = [
        JobInsertParams(kind="tests.job", queue="bq", batch_id=batch_id),
        JobInsertParams(kind="tests.job", queue="bq", batch_id=batch_id, unique_key="k"),
    ]

    with pytest.raises(InvalidJob, match="cannot have a unique key") as refused:
        insert_many(engine, params, db_now)

    assert refused.value.field == "unique_key"
    assert engine.job_list(JobListParams(queue="bq", limit=10)) == []


def test_batch_get__unknown_batch_is_none(engine: BaseEngine) -> None:
    assert engine.batch_get(uuid.uuid4()) is None


def test_finalize__counts_progress_and_the_last_job_completes_the_batch_with_callbacks(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    batch_id, _ = make_batch(engine, db_now, 2)
    first, second = claim(engine, client_id, db_now, queue="bq")
    finalize(engine, db_now, result(first, "completed", output=1))
    engine.batch_settle(BatchSettleParams(ids=(batch_id,), now=db_now))
    assert engine.batch_get(batch_id).pending == 1  # type: ignore[union-attr]

    finalize(engine, db_now, result(second, "completed"))
    settled = engine.batch_settle(BatchSettleParams(ids=(batch_id,), now=db_now))

    batch = engine.batch_get(batch_id)
    assert batch is not None and batch.pending == 0 and batch.completed_at is not None
    assert settled.completed in (0, 1)  # SQLite settles inside the finalize
    got = sorted(j.metadata["on"] for j in callbacks(engine))
    assert got == ["complete", "success"]
    assert all(j.metadata["batch_id"] == str(batch_id) for j in callbacks(engine))


def test_finalize__a_discarded_job_fails_the_batch_and_fires_on_failure(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    batch_id, _ = make_batch(engine, db_now, 2)
    first, second = claim(engine, client_id, db_now, queue="bq")

    finalize(engine, db_now, result(first, "completed"), result(second, "discarded"))
    engine.batch_settle(BatchSettleParams(ids=(batch_id,), now=db_now))

    batch = engine.batch_get(batch_id)
    assert batch is not None and batch.failed == 1 and batch.completed_at is not None
    assert sorted(j.metadata["on"] for j in callbacks(engine)) == ["complete", "failure"]


def test_batch_settle__settling_twice_fires_callbacks_once(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    batch_id, _ = make_batch(engine, db_now, 1)
    (job,) = claim(engine, client_id, db_now, queue="bq")
    finalize(engine, db_now, result(job, "completed"))

    for _ in range(3):
        engine.batch_settle(BatchSettleParams(ids=(batch_id,), now=db_now))
        engine.batch_settle(BatchSettleParams(now=db_now, results=True))

    assert len(callbacks(engine)) == 2


def test_batch_settle__the_sweep_completes_batches_left_open(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    batch_id, _ = make_batch(engine, db_now, 1)
    (job,) = claim(engine, client_id, db_now, queue="bq")
    finalize(engine, db_now, result(job, "canceled"))

    swept = engine.batch_settle(BatchSettleParams(now=db_now))

    batch = engine.batch_get(batch_id)
    assert batch is not None and batch.completed_at is not None and batch.failed == 1
    assert swept.last in (None, batch_id)


def test_batch_settle__empty_ids_settle_nothing(engine: BaseEngine) -> None:
    assert engine.batch_settle(BatchSettleParams(ids=())).folded == 0


def test_job_cancel__of_a_waiting_batch_job_counts_as_failed(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    from django_hopper.engine.params import JobCancelParams, JobDeleteParams

    batch_id, (a, b) = make_batch(engine, db_now, 2)

    engine.job_cancel(JobCancelParams(id=a.id, now=db_now))
    engine.job_delete(JobDeleteParams(id=b.id))

    batch = engine.batch_get(batch_id)
    assert batch is not None
    assert (batch.pending, batch.failed) == (0, 2) and batch.completed_at is not None
    assert sorted(j.metadata["on"] for j in callbacks(engine)) == ["complete", "failure"]
