"""History retention also deletes what gone jobs leave behind (issue 6: bounded for months).

Nothing else deletes batches, workflow edges or step-ledger rows, so the
retention pass removes, in bounded chunks, completed batches none of whose
jobs remain (live or in history) and none of whose callbacks is live, edges
whose dependent is gone, and ledger rows whose job is gone.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    BatchInsertParams,
    BatchSettleParams,
    HistoryMaintainParams,
    HistoryMaintainResult,
    JobDeleteParams,
    JobDependency,
    JobInsertParams,
    JobStepRecordParams,
    WorkflowInsertParams,
)
from django_hopper.ids import new_id
from django_hopper.models import Batch, BatchProgress, JobStep
from django_hopper.models import JobDependency as Edge
from django_hopper.types import JobRow
from tests.engine_conformance.support import claim, claim_one, finalize, insert, register, result

DAY = dt.timedelta(days=1)


def maintain(engine: BaseEngine, now: dt.datetime, **params: Any) -> HistoryMaintainResult:
    e: Any = engine
    return e.history_maintain(  # type: ignore[no-any-return]
        HistoryMaintainParams(
            completed_retention=7 * DAY,
            failed_retention=30 * DAY,
            create=False,
            drop=False,
            now=now,
            **params,
        )
    )


def finish(engine: BaseEngine, now: dt.datetime, job: JobRow, state: str = "completed") -> None:
    finalize(engine, now, result(job, state))
    if job.batch_id is not None:
        e: Any = engine
        e.batch_settle(BatchSettleParams(ids=(job.batch_id,)))


def record_step(engine: BaseEngine, job: JobRow) -> None:
    e: Any = engine
    e.job_step_record(
        JobStepRecordParams(
            id=job.id,
            step="s1",
            attempted_by=job.attempted_by,
            fence=job.fence,
            done=True,
            result={"ok": True},
        )
    )


def test_retention__deletes_batches_edges_and_ledgers_once_their_jobs_are_gone(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    e: Any = engine
    client_id = register(engine, db_now)
    # A batch of one job, completed; its callback is left waiting for now.
    batch_id = e.batch_insert(
        BatchInsertParams(
            total=1, on_complete=JobInsertParams(kind="tests.cb", queue="orph-cb"), now=db_now
        )
    )
    insert(engine, db_now, queue="orph-b", batch_id=batch_id)
    finish(engine, db_now, claim_one(engine, client_id, db_now, queue="orph-b"))
    assert e.batch_get(batch_id).completed_at is not None
    # A workflow a -> b, both completed.
    wf = e.workflow_insert(
        WorkflowInsertParams(
            name="orph",
            jobs=[JobInsertParams(kind="tests.a", queue="orph-w")] * 2,
            deps=[JobDependency(job=1, depends_on=0)],
            now=db_now,
        )
    )
    for _ in range(2):
        finish(engine, db_now, claim_one(engine, client_id, db_now, queue="orph-w"))
    # A run discarded with its ledger (evidence), and a live one deleted: delete_job
    # takes its ledger with it at once.
    insert(engine, db_now, queue="orph-s")
    discarded = claim_one(engine, client_id, db_now, queue="orph-s")
    record_step(engine, discarded)
    finish(engine, db_now, discarded, "discarded")
    insert(engine, db_now, queue="orph-d")
    deleted = claim_one(engine, client_id, db_now, queue="orph-d")
    record_step(engine, deleted)
    finish(engine, db_now, deleted, "retryable")
    e.job_delete(JobDeleteParams(id=deleted.id))

    assert set(JobStep.objects.values_list("job_id", flat=True)) == {discarded.id}

    fresh = maintain(engine, db_now)  # nothing expired, nothing orphaned

    assert (fresh.batches_deleted, fresh.edges_deleted, fresh.steps_deleted) == (0, 0, 0)
    assert set(JobStep.objects.values_list("job_id", flat=True)) == {discarded.id}
    assert Edge.objects.filter(workflow_id=wf.id).count() == 1
    assert Batch.objects.filter(id__in=[batch_id, wf.id]).count() == 2

    later = maintain(engine, db_now + 31 * DAY)  # history pruned; the callback still waits

    assert later.pruned >= 4
    assert (later.batches_deleted, later.edges_deleted, later.steps_deleted) == (1, 1, 1)
    assert list(Batch.objects.values_list("id", flat=True)) == [batch_id]
    assert not Edge.objects.exists() and not JobStep.objects.exists()

    (callback,) = claim(engine, client_id, db_now, queue="orph-cb")
    finish(engine, db_now, callback)
    last = maintain(engine, db_now + 31 * DAY)

    assert last.batches_deleted == 1
    assert not Batch.objects.exists() and not BatchProgress.objects.exists()


def test_retention__deletes_orphans_in_bounded_chunks(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    # Ledger rows whose job is gone by another way than delete_job (which takes them
    # with it): a restored dump, a job row removed by hand.
    for i in range(5):
        JobStep.objects.create(
            job_id=new_id(), step=f"s{i}", result={"value": i}, attempts=1, recorded_at=db_now
        )

    first = maintain(engine, db_now, chunk_size=2, max_chunks=2)

    assert first.steps_deleted == 4 and JobStep.objects.count() == 1
    assert maintain(engine, db_now, chunk_size=2, max_chunks=2).steps_deleted == 1
