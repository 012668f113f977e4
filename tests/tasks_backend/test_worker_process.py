"""Tasks run by real ``hopper_worker`` processes: what a project sees from outside."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.utils import timezone

from django_hopper.conf import hopper_settings
from django_hopper.engine.params import JobRetryParams
from django_hopper.models import Job
from django_hopper.tasks_compat import NAMESPACE, TaskResultStatus
from tests.tasks_backend import tasks
from tests.testapp.models import Effect


def notes(result: Any) -> list[str]:
    """Return what the worker's ORM receivers recorded for a task, in order."""
    rows = Effect.objects.filter(job_id=uuid.UUID(result.id)).order_by("id")
    return [row.note for row in rows]


def test_a_failed_tasks_error_log_line_carries_its_exception(worker_process: Any) -> None:
    result = tasks.failing_task_value_error.enqueue()
    output = worker_process()
    line = f"ERROR:{NAMESPACE}:Task id={result.id} path={result.task.module_path} state=FAILED"
    assert line in output, output
    after = output[output.index(line) :]
    assert after.startswith(f"{line}\nTraceback (most recent call last):"), output
    assert "ValueError: This Task failed due to ValueError" in after, output


def test_a_successful_task_logs_no_exception(worker_process: Any) -> None:
    result = tasks.noop_task.enqueue()
    output = worker_process()
    assert f"Task id={result.id} path={result.task.module_path} state=SUCCESSFUL" in output
    assert "Traceback" not in output and "NoneType" not in output, output


def test_an_exception_group_is_reported_as_its_own_class(worker_process: Any) -> None:
    result = tasks.failing_task_exception_group.enqueue()
    worker_process()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.ExceptionGroup"
    assert result.errors[0].exception_class is ExceptionGroup
    assert "ValueError: one" in result.errors[0].traceback


def test_worker_ids_name_the_worker_of_each_attempt(worker_process: Any, tx_engine: Any) -> None:
    result = tasks.flaky.enqueue(1)
    worker_process()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    (first,) = result.worker_ids
    tx_engine.job_retry(JobRetryParams(id=uuid.UUID(result.id)))  # no waiting for the backoff
    worker_process()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    assert result.worker_ids[0] == first
    assert result.worker_ids[1] != first  # another process: another hopper client
    row = tx_engine.job_get(uuid.UUID(result.id))
    assert result.worker_ids == [str(row.errors[0].by), str(row.attempted_by)]


def test_a_task_whose_import_path_went_stale_fails_with_the_import_error(
    worker_process: Any,
) -> None:
    result = tasks.add.enqueue(1, 2)
    stale = "tests.tasks_backend.renamed_module.add"
    # The task's module was renamed after the enqueue, longer ago than the
    # grace a worker gives an unknown kind to be served by a newer release.
    grace = dt.timedelta(seconds=hopper_settings.UNKNOWN_KIND_GRACE + 60)
    enqueued = timezone.now() - grace
    assert (
        Job.objects.filter(id=uuid.UUID(result.id)).update(
            kind=stale, created_at=enqueued, scheduled_at=enqueued
        )
        == 1
    )
    output = worker_process()
    got = tasks.add.get_backend().get_result(result.id)
    assert got.status == TaskResultStatus.FAILED
    assert got.task.module_path == stale
    assert issubclass(got.errors[-1].exception_class, ImportError)
    assert "renamed_module" in got.errors[-1].traceback
    assert f"Task id={result.id} path={stale} state=FAILED" in output, output


def test_async_tasks_send_their_signals_where_orm_receivers_work(worker_process: Any) -> None:
    ok = tasks.add_async.enqueue(1, 2)
    bad = tasks.failing_task_async.enqueue()
    sync_ok = tasks.add.enqueue(1, 2)
    worker_process()
    for result in (ok, bad, sync_ok):
        result.refresh()
    assert (ok.status, ok.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    assert notes(ok) == ["started RUNNING", "finished SUCCESSFUL"]
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class is ValueError
    assert notes(bad) == ["started RUNNING", "finished FAILED"]
    assert notes(sync_ok) == ["started RUNNING", "finished SUCCESSFUL"]


def test_a_return_value_with_a_nul_character_fails_the_task_with_a_clear_error(
    worker_process: Any,
) -> None:
    result = tasks.returns_nul.enqueue()
    worker_process()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_hopper.exceptions.InvalidJob"
    assert "the task's return value contains a NUL character" in result.errors[0].traceback
