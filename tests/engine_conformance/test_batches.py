"""Batches: progress recorded by finalizes, folded by batch_settle, callbacks once."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    BatchDuplicatesParams,
    BatchInsertParams,
    BatchSettleParams,
    JobInsertParams,
    JobListParams,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.models import Batch
from django_hopper.types import JobRow
from tests.engine_conformance.support import claim, finalize, get, insert_many, result

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


def keyed(batch_id: uuid.UUID, key: str, **fields: Any) -> JobInsertParams:
    return JobInsertParams(
        kind="tests.job",
        queue="bq",
        batch_id=batch_id,
        unique_key=key,
        unique_finished=("completed", "canceled", "discarded"),
        **fields,
    )


def open_batch(engine: BaseEngine, now: dt.datetime, total: int) -> uuid.UUID:
    batch_id, _ = make_batch(engine, now, 0)
    Batch.objects.filter(id=batch_id).update(total=total, pending=total)
    return batch_id


def finished_job(
    engine: BaseEngine, client_id: int, now: dt.datetime, key: str, state: str
) -> JobRow:
    """Insert a job with ``key`` in queue "done" and finalize it in ``state``."""
    insert_many(engine, [JobInsertParams(kind="tests.job", queue="done", unique_key=key)], now)
    (job,) = claim(engine, client_id, now, queue="done")
    finalize(engine, now, result(job, state))
    return job


def test_job_insert_many__a_batch_input_found_in_history_counts_toward_the_batch(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    old = finished_job(engine, client_id, db_now, "k1", "completed")
    batch_id = open_batch(engine, db_now, 2)

    results = insert_many(engine, [keyed(batch_id, "k1"), keyed(batch_id, "k2")], db_now)

    assert [(r.duplicate, r.job.id == old.id) for r in results] == [(True, True), (False, False)]
    batch = engine.batch_get(batch_id)
    assert batch is not None and (batch.pending, batch.failed, batch.completed_at) == (1, 0, None)
    (fresh,) = claim(engine, client_id, db_now, queue="bq")
    finalize(engine, db_now, result(fresh, "completed"))
    engine.batch_settle(BatchSettleParams(ids=(batch_id,), now=db_now))
    batch = engine.batch_get(batch_id)
    assert batch is not None and batch.pending == 0 and batch.completed_at is not None
    assert sorted(j.metadata["on"] for j in callbacks(engine)) == ["complete", "success"]


def test_job_insert_many__a_batch_of_history_duplicates_completes_at_insert(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    finished_job(engine, client_id, db_now, "k1", "completed")
    finished_job(engine, client_id, db_now, "k2", "discarded")
    batch_id = open_batch(engine, db_now, 2)

    results = insert_many(engine, [keyed(batch_id, "k1"), keyed(batch_id, "k2")], db_now)

    assert all(r.duplicate for r in results)
    batch = engine.batch_get(batch_id)
    assert batch is not None and (batch.pending, batch.failed) == (0, 1)
    assert batch.completed_at is not None
    assert sorted(j.metadata["on"] for j in callbacks(engine)) == ["complete", "failure"]


def test_job_insert_many__a_waiting_duplicate_of_no_batch_joins_the_batch(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    (held,) = insert_many(
        engine, [JobInsertParams(kind="tests.job", queue="bq", unique_key="k1")], db_now
    )
    batch_id = open_batch(engine, db_now, 1)

    (dup,) = insert_many(engine, [keyed(batch_id, "k1")], db_now)

    assert dup.duplicate and dup.job.id == held.job.id
    assert get(engine, held.job).batch_id == batch_id
    assert engine.batch_get(batch_id).pending == 1  # type: ignore[union-attr]
    (job,) = claim(engine, client_id, db_now, queue="bq")
    finalize(engine, db_now, result(job, "canceled"))
    engine.batch_settle(BatchSettleParams(ids=(batch_id,), now=db_now))
    batch = engine.batch_get(batch_id)
    assert batch is not None and (batch.pending, batch.failed) == (0, 1)
    assert batch.completed_at is not None


def test_job_insert_many__a_running_duplicate_or_another_batchs_job_counts_done_at_once(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    insert_many(engine, [JobInsertParams(kind="tests.job", queue="run", unique_key="r")], db_now)
    (running_job,) = claim(engine, client_id, db_now, queue="run")
    other = open_batch(engine, db_now, 1)
    (theirs,) = insert_many(engine, [keyed(other, "o")], db_now)
    batch_id = open_batch(engine, db_now, 3)

    results = insert_many(
        engine, [keyed(batch_id, "r"), keyed(batch_id, "o"), keyed(batch_id, "new")], db_now
    )

    assert [r.duplicate for r in results] == [True, True, False]
    assert get(engine, running_job).batch_id is None, "a running attempt keeps its batch"
    assert get(engine, theirs.job).batch_id == other, "a job reports to one batch"
    batch = engine.batch_get(batch_id)
    assert batch is not None and (batch.pending, batch.failed, batch.completed_at) == (1, 0, None)
    assert engine.batch_get(other).pending == 1  # type: ignore[union-attr]


def test_batch_count_duplicates__refuses_what_is_not_a_pair_of_ids(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob, match="pairs") as refused:
        engine.batch_count_duplicates(BatchDuplicatesParams((("b", "j"),)))  # type: ignore[arg-type]
    assert refused.value.field == "duplicates"
    assert engine.batch_count_duplicates(BatchDuplicatesParams(())).counted == 0


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
