"""Data-subject erasure: every row of the subject loses its data, atomically, fenced
against a running attempt, recorded without the data."""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from typing import Any

import pytest
from django.db import connection, transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    BatchInsertParams,
    HistoryMaintainParams,
    JobClaimByIDParams,
    JobDependency,
    JobInsertParams,
    JobRecordProgressParams,
    JobRetryManyParams,
    JobRetryParams,
    JobStepRecordParams,
    SubjectEraseParams,
    WorkflowInsertParams,
)
from django_hopper.exceptions import InvalidJob, JobErased, JobFenced
from django_hopper.models import DependencyResult, Erasure, JobLog, JobStep
from django_hopper.types import AttemptError, JobOutcome, JobRow, JobState
from tests.engine_conformance.support import (
    MINUTE,
    claim,
    finalize,
    get,
    insert,
    register,
    result,
    running,
)
from tests.support.runtime import wait_for

SUBJECT = "user:42"
DAY = dt.timedelta(days=1)

#: What the subject's jobs were handed: every field an erasure empties.
PERSONAL: dict[str, Any] = {
    "args": {"args": ["ada@example.com"], "kwargs": {"name": "Ada"}},
    "metadata": {"email": "ada@example.com"},
    "tags": ("ada",),
    "unique_key": "welcome:ada@example.com",
    "ordering_key": "ada",
    "partition_key": "ada",
}


def erase(engine: BaseEngine, now: dt.datetime, subject: str = SUBJECT) -> Any:
    return engine.subject_erase(SubjectEraseParams(subject=subject, now=now))


def assert_erased(row: JobRow, now: dt.datetime) -> None:
    assert row.erased_at == now
    assert (row.args, row.metadata, row.tags, row.errors) == ({}, {}, [], [])
    assert (row.unique_key, row.ordering_key, row.partition_key) == (None, None, None)
    assert (row.progress, row.output, row.subject, row.snooze_reason) == (None, None, None, None)
    assert row.decode_error is None


def test_subject_erase__empties_live_and_history_rows_and_leaves_other_subjects_alone(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    waiting = insert(engine, db_now, queue="mail", subject=SUBJECT, **PERSONAL)
    done = running(engine, client_id, db_now, subject=SUBJECT, args={"n": "Ada"})
    finalize(
        engine,
        db_now,
        result(done, "completed", output={"sent_to": "ada@example.com"}, log="mailed Ada"),
        keep_logs=5,
    )
    other = insert(engine, db_now, queue="mail", subject="user:7", args={"n": "Bob"})
    plain = insert(engine, db_now, queue="mail", args={"n": "Cy"})

    erasure = erase(engine, db_now)

    ended = get(engine, waiting)
    assert ended.state == JobState.DISCARDED and ended.finalized_at == db_now
    assert (ended.kind, ended.queue) == (waiting.kind, waiting.queue), "identity is kept"
    assert_erased(ended, db_now)
    kept = get(engine, done)
    assert kept.state == JobState.COMPLETED and kept.attempt == 1
    assert_erased(kept, db_now)
    assert not JobLog.objects.filter(job_id=done.id).exists()
    assert get(engine, other).args == {"n": "Bob"} and get(engine, other).subject == "user:7"
    assert get(engine, plain).args == {"n": "Cy"} and get(engine, plain).erased_at is None
    assert (erasure.jobs, erasure.running, erasure.logs) == (2, 0, 1)
    assert erasure.ended == [waiting.id]


def test_subject_erase__records_when_and_how_many_rows_without_the_subject(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    insert(engine, db_now, subject=SUBJECT)
    insert(engine, db_now, subject=SUBJECT)

    first = erase(engine, db_now)
    again = erase(engine, db_now + MINUTE)

    digest = hashlib.sha256(SUBJECT.encode()).hexdigest()
    rows = Erasure.objects.order_by("id")
    records = list(rows.values_list("subject_digest", "jobs", "erased_at"))
    assert records == [(digest, 2, db_now), (digest, 0, db_now + MINUTE)]
    assert (first.subject_digest, first.jobs, again.jobs) == (digest, 2, 0)
    with connection.cursor() as c:
        c.execute("SELECT * FROM hopper_erasure")
        stored = c.fetchall()
    assert len(stored) == 2 and SUBJECT not in repr(stored)


def test_subject_erase__deletes_the_step_ledger_and_empties_a_runs_cursor(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    job = running(engine, client_id, db_now, subject=SUBJECT)
    claim = {"id": job.id, "attempted_by": job.attempted_by, "fence": job.fence}
    engine.job_step_record(
        JobStepRecordParams(step="fetch", done=True, result={"name": "Ada"}, now=db_now, **claim)
    )
    engine.job_record_progress(
        JobRecordProgressParams(
            attempt=job.attempt, step="pass", cursor={"after": "Ada"}, now=db_now, **claim
        )
    )

    erasure = erase(engine, db_now)

    assert (erasure.steps, erasure.running, erasure.fenced) == (1, 1, [job.id])
    assert not JobStep.objects.filter(job_id=job.id).exists()
    assert engine.job_steps(job.id) == []
    assert_erased(get(engine, job), db_now)


def test_subject_erase__fences_the_running_attempt_so_its_later_writes_store_nothing(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    job = running(engine, client_id, db_now, subject=SUBJECT, args={"n": "Ada"})
    claim = {"id": job.id, "attempted_by": job.attempted_by, "fence": job.fence}
    erase(engine, db_now)
    later = db_now + MINUTE

    applied = finalize(
        engine,
        later,
        result(
            job,
            "completed",
            output={"n": "Ada"},
            log="Ada again",
            error=AttemptError(at=later, attempt=1, error="Ada"),
        ),
        keep_logs=5,
    )
    progress = engine.job_record_progress(
        JobRecordProgressParams(attempt=job.attempt, step="s", cursor={"n": "Ada"}, **claim)
    )
    with pytest.raises(JobFenced):
        engine.job_step_record(
            JobStepRecordParams(step="s", done=True, result={"n": "Ada"}, now=later, **claim)
        )

    assert (applied, progress) == ([], None)
    row = get(engine, job)
    assert row.state == JobState.DISCARDED
    assert_erased(row, db_now)
    assert not JobLog.objects.filter(job_id=job.id).exists()
    assert not JobStep.objects.filter(job_id=job.id).exists()


def test_subject_erase__fences_a_pass_under_a_job_lease(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, subject=SUBJECT, args={"n": "Ada"})
    leased = engine.job_claim_by_id(
        JobClaimByIDParams(id=job.id, fence=job.fence, ttl=MINUTE, now=db_now)
    )
    erase(engine, db_now)

    with pytest.raises(JobFenced):
        engine.job_step_record(
            JobStepRecordParams(
                id=job.id,
                step="s",
                attempted_by=None,
                fence=leased.lease.fence,
                lease_token=leased.lease.token,
                done=True,
                result={"n": "Ada"},
                now=db_now,
            )
        )
    assert_erased(get(engine, job), db_now)


def test_subject_erase__ends_a_batch_job_as_failed_and_settles_the_batch(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    batch_id = engine.batch_insert(BatchInsertParams(total=1, now=db_now))
    insert(engine, db_now, subject=SUBJECT, batch_id=batch_id)

    erase(engine, db_now)

    batch = engine.batch_get(batch_id)
    assert batch is not None and (batch.pending, batch.failed) == (0, 1)
    assert batch.completed_at is not None


def test_subject_erase__is_atomic_with_the_callers_transaction(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, subject=SUBJECT, args={"n": "Ada"})

    with pytest.raises(RuntimeError), transaction.atomic():
        erase(engine, db_now)
        raise RuntimeError("roll back")

    assert get(engine, job).args == {"n": "Ada"} and get(engine, job).erased_at is None
    assert not Erasure.objects.exists()


@pytest.mark.parametrize("subject", ["", None, 7, "s" * 256])
def test_subject_erase__refuses_a_subject_no_job_could_carry_writing_nothing(
    engine: BaseEngine, db_now: dt.datetime, subject: Any
) -> None:
    insert(engine, db_now, subject=SUBJECT)

    with pytest.raises(InvalidJob) as refused:
        erase(engine, db_now, subject=subject)

    assert refused.value.field == "subject"
    assert not Erasure.objects.exists()


def test_job_retry__refuses_an_erased_job_alone_and_in_a_set(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    erased = running(engine, client_id, db_now, subject=SUBJECT)
    finalize(engine, db_now, result(erased, "discarded"))
    kept = running(engine, client_id, db_now)
    finalize(engine, db_now, result(kept, "discarded"))
    erase(engine, db_now)

    with pytest.raises(JobErased, match="erased"):
        engine.job_retry(JobRetryParams(id=erased.id, now=db_now))
    many = engine.job_retry_many(JobRetryManyParams(ids=[erased.id, kept.id], now=db_now))

    assert many.outcomes == {erased.id: JobOutcome.ERASED, kept.id: JobOutcome.RETRIED}
    assert get(engine, erased).state == JobState.DISCARDED
    assert get(engine, kept).state == JobState.AVAILABLE


def test_subject_erase__reaches_history_in_every_partition(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    if engine.features.supports_history_partitions:
        engine.history_maintain(
            HistoryMaintainParams(
                completed_retention=30 * DAY, failed_retention=30 * DAY, create_ahead=2, now=db_now
            )
        )
    days = [db_now, db_now + DAY, db_now + 90 * DAY]  # the last lands in DEFAULT
    jobs = []
    for day in days:
        job = running(engine, client_id, db_now, subject=SUBJECT, args={"n": "Ada"})
        finalize(engine, day, result(job, "completed", output={"n": "Ada"}))
        jobs.append(job)

    erase(engine, db_now + 91 * DAY)

    for job in jobs:
        assert_erased(get(engine, job), db_now + 91 * DAY)
    if engine.features.supports_history_partitions:
        with connection.cursor() as c:
            c.execute(
                "SELECT count(DISTINCT tableoid) FROM hopper_job_history WHERE id = ANY(%s)",
                [[j.id for j in jobs]],
            )
            assert c.fetchone()[0] == 3


def test_subject_erase__empties_the_output_a_workflow_keeps_for_dependents(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    flow = engine.workflow_insert(
        WorkflowInsertParams(
            name="welcome",
            jobs=[
                JobInsertParams(kind="tests.fetch", queue="wf", subject=SUBJECT),
                JobInsertParams(kind="tests.mail", queue="wf"),
            ],
            steps=["fetch", "mail"],
            deps=[JobDependency(job=1, depends_on=0, reads=True)],
            now=db_now,
        )
    )
    (fetch,) = claim(engine, client_id, db_now, queue="wf")
    finalize(engine, db_now, result(fetch, "completed", output={"email": "ada@example.com"}))
    assert DependencyResult.objects.get(job_id=fetch.id).output == {"email": "ada@example.com"}

    erasure = erase(engine, db_now)

    kept = DependencyResult.objects.get(job_id=fetch.id)
    assert (kept.output, kept.state, erasure.results) == (None, "completed", 1)
    assert flow.jobs[1].job.subject is None


def lock_waiters() -> int:
    with connection.cursor() as c:
        c.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(c.fetchone()[0])


def test_subject_erase__erases_a_job_a_concurrent_retry_moves_back_to_live(
    tx_engine: BaseEngine,
) -> None:
    if tx_engine.features.single_writer:
        pytest.skip("one writer at a time: no retry can run beside the erasure")
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    job = running(tx_engine, client_id, now, subject=SUBJECT, args={"n": "Ada"})
    finalize(tx_engine, now, result(job, "discarded"))
    retried, release, erased = threading.Event(), threading.Event(), []

    def retry() -> None:
        try:
            with transaction.atomic():
                tx_engine.job_retry(JobRetryParams(id=job.id))
                retried.set()
                release.wait(10)
        finally:
            connection.close()

    def erase_now() -> None:
        try:
            erased.append(tx_engine.subject_erase(SubjectEraseParams(subject=SUBJECT)))
        finally:
            connection.close()

    threads = [threading.Thread(target=retry, daemon=True)]
    threads[0].start()
    assert retried.wait(10)
    threads.append(threading.Thread(target=erase_now, daemon=True))
    threads[1].start()
    wait_for(lambda: lock_waiters() >= 1)  # the erasure waits for the retry's row
    release.set()
    for thread in threads:
        thread.join(10)

    row = get(tx_engine, job)
    assert row.state == JobState.DISCARDED and row.erased_at is not None
    assert row.args == {} and erased[0].jobs == 1 and erased[0].ended == [job.id]
