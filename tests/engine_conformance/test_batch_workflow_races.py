"""Batches and workflows under concurrent finalizes, on committed data.

Issue 5: "callbacks fire once ... last two jobs finish at the same instant".
Two threads released by a barrier finalize the last two jobs of a batch (or the
two dependencies of a join) in separate transactions, then settle as the
worker does (``settle_finished``), and nothing is left for the leader's sweep.
On PostgreSQL the two finalizes overlap; on SQLite the single writer
serializes them, and the same outcome must hold.

A settle or promotion of named jobs waits only briefly for a row another
transaction holds (a user's cancel inside a long ``atomic()``), and leaves it
to the sweep.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    BatchInsertParams,
    BatchSettleParams,
    JobCancelParams,
    JobDependency,
    JobInsertParams,
    JobListParams,
    WorkflowInsertParams,
    WorkflowPromoteParams,
)
from django_hopper.models import Batch, Job
from django_hopper.types import JobRow
from django_hopper.worker.completer import settle_finished
from tests.engine_conformance.support import claim, finalize, insert_many, register, result
from tests.engine_conformance.test_concurrency import run_threads

CALLBACK = "tests.race_callback"
ROUNDS = 60


def finish_together(engine: BaseEngine, now: dt.datetime, pair: list[JobRow]) -> None:
    """Finalize two jobs at once in two threads (own connections), each then settling."""

    def finish(i: int) -> None:
        job = pair[i]
        finalize(engine, now, result(job, "completed", output={"n": i}))
        settle_finished(engine, [job])

    run_threads(2, finish)


def test_batch__last_two_jobs_finished_at_once_complete_it_with_callbacks_once(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    batches = []
    for _ in range(ROUNDS):
        batch_id = tx_engine.batch_insert(
            BatchInsertParams(
                total=2, on_complete=JobInsertParams(kind=CALLBACK, queue="race-cb"), now=now
            )
        )
        insert_many(
            tx_engine,
            [JobInsertParams(kind="tests.job", queue="race-b", batch_id=batch_id)] * 2,
            now,
        )
        batches.append(batch_id)
    by_batch: dict[Any, list[JobRow]] = {}
    for job in claim(tx_engine, client_id, now, queue="race-b", limit=1000):
        by_batch.setdefault(job.batch_id, []).append(job)

    for pair in by_batch.values():
        finish_together(tx_engine, now, pair)

    completed = [b for b in batches if tx_engine.batch_get(b).completed_at is not None]  # type: ignore[union-attr]
    assert len(completed) == ROUNDS  # every batch completed without the sweep
    fired = Counter(
        j.metadata["batch_id"]
        for j in tx_engine.job_list(JobListParams(kinds=(CALLBACK,), limit=1000))
    )
    assert fired == Counter({str(b): 1 for b in batches})


def test_workflow__two_dependencies_finished_at_once_promote_the_join_without_the_sweep(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    joins = []
    for i in range(ROUNDS):
        inserted = tx_engine.workflow_insert(
            WorkflowInsertParams(
                name=f"join-{i}",
                jobs=[
                    JobInsertParams(kind="tests.dep", queue="race-d"),
                    JobInsertParams(kind="tests.dep", queue="race-d"),
                    JobInsertParams(kind="tests.join", queue="race-j"),
                ],
                deps=[
                    JobDependency(job=2, depends_on=0, reads=True),
                    JobDependency(job=2, depends_on=1, reads=True),
                ],
                now=now,
            )
        )
        joins.append(inserted.jobs[2].job.id)
    by_workflow: dict[Any, list[JobRow]] = {}
    for job in claim(tx_engine, client_id, now, queue="race-d", limit=1000):
        by_workflow.setdefault(job.batch_id, []).append(job)

    for pair in by_workflow.values():
        finish_together(tx_engine, now, pair)

    assert Counter(tx_engine.job_get(j).state for j in joins) == Counter({"available": ROUNDS})
    claimed = claim(tx_engine, client_id, now, queue="race-j", limit=1000)
    assert sorted(j.id for j in claimed) == sorted(joins)
    assert all(len(j.dependencies or []) == 2 for j in claimed)


@contextmanager
def held(model: type[Job] | type[Batch], pk: Any) -> Iterator[None]:
    """Hold a row's lock in another connection's transaction for the block's duration."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                model.objects.select_for_update().get(pk=pk)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


def skip_single_writer(engine: BaseEngine) -> None:
    if engine.features.single_writer:
        pytest.skip("one writer at a time: no other transaction holds a row meanwhile")


def test_batch_settle__leaves_a_batch_another_transaction_holds_to_the_sweep(
    tx_engine: BaseEngine,
) -> None:
    skip_single_writer(tx_engine)
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    batch_id = tx_engine.batch_insert(
        BatchInsertParams(total=1, on_complete=JobInsertParams(kind=CALLBACK, queue="cb"))
    )
    insert_many(
        tx_engine, [JobInsertParams(kind="tests.job", queue="held-b", batch_id=batch_id)], now
    )
    (job,) = claim(tx_engine, client_id, now, queue="held-b")
    finalize(tx_engine, now, result(job, "completed"))

    with held(Batch, batch_id):
        started = time.monotonic()
        settled = tx_engine.batch_settle(BatchSettleParams(ids=(batch_id,)))
        waited = time.monotonic() - started

    assert waited < 2 and settled.folded == 0  # it did not wait for the holder
    assert tx_engine.batch_get(batch_id).completed_at is None  # type: ignore[union-attr]
    swept = tx_engine.batch_settle(BatchSettleParams(ids=None))
    assert swept.completed == 1
    assert len(tx_engine.job_list(JobListParams(kinds=(CALLBACK,), limit=10))) == 1


def test_batch_settle__a_cancel_in_a_long_transaction_does_not_block_a_sibling_finishing(
    tx_engine: BaseEngine,
) -> None:
    skip_single_writer(tx_engine)
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    batch_id = tx_engine.batch_insert(
        BatchInsertParams(total=2, on_complete=JobInsertParams(kind=CALLBACK, queue="cb"))
    )
    waiting, _ = (
        r.job
        for r in insert_many(
            tx_engine,
            [
                JobInsertParams(kind="tests.job", queue="held-w", batch_id=batch_id),
                JobInsertParams(kind="tests.job", queue="held-r", batch_id=batch_id),
            ],
            now,
        )
    )
    (sibling,) = claim(tx_engine, client_id, now, queue="held-r")
    canceled, release = threading.Event(), threading.Event()

    def cancel_and_linger() -> None:
        try:
            with transaction.atomic():
                tx_engine.job_cancel(JobCancelParams(id=waiting.id))
                canceled.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=cancel_and_linger, daemon=True)
    thread.start()
    try:
        assert canceled.wait(10)
        started = time.monotonic()
        finalize(tx_engine, now, result(sibling, "completed"))
        settle_finished(tx_engine, [sibling])
        assert time.monotonic() - started < 2  # not held up by the user's transaction
    finally:
        release.set()
        thread.join(10)

    tx_engine.batch_settle(BatchSettleParams(ids=None))
    batch = tx_engine.batch_get(batch_id)
    assert batch is not None and batch.completed_at is not None and batch.failed == 1
    assert len(tx_engine.job_list(JobListParams(kinds=(CALLBACK,), limit=10))) == 1


def test_workflow_promote_ready__a_cancel_leaves_a_join_another_transaction_holds_to_the_sweep(
    tx_engine: BaseEngine,
) -> None:
    skip_single_writer(tx_engine)
    now = tx_engine.now()
    inserted = tx_engine.workflow_insert(
        WorkflowInsertParams(
            name="held",
            jobs=[
                JobInsertParams(kind="tests.dep", queue="held-d"),
                JobInsertParams(kind="tests.join", queue="held-j"),
            ],
            deps=[JobDependency(job=1, depends_on=0, on_failure="run")],
            now=now,
        )
    )
    dep, join = (r.job for r in inserted.jobs)

    with held(Job, join.id):
        started = time.monotonic()
        tx_engine.job_cancel(JobCancelParams(id=dep.id))  # promotes the named dependents
        waited = time.monotonic() - started
        assert tx_engine.job_get(join.id).state == "pending"  # type: ignore[union-attr]

    assert waited < 2  # it did not wait for the holder
    assert tx_engine.workflow_promote_ready(WorkflowPromoteParams()).promoted == 1
    assert tx_engine.job_get(join.id).state == "available"  # type: ignore[union-attr]
