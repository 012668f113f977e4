"""HopperBackend: tasks stored, run and read back as hopper jobs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobInsertParams,
    JobRetryParams,
)
from django_hopper.tasks import (
    HopperBackend,
    HopperTask,
    hopper_options,
    job_context,
    task_error,
)
from django_hopper.tasks_compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.tasks_backend import tasks


def job_of(engine: Any, result: Any) -> Any:
    row = engine.job_get(uuid.UUID(result.id))
    assert row is not None
    return row


def claim(engine: Any, queue: str = "default") -> list[Any]:
    client = engine.client_register(
        ClientRegisterParams(hostname="test", ttl=dt.timedelta(minutes=5))
    )
    return engine.job_claim(JobClaimParams(queue=queue, client_id=client, limit=10)).jobs


class Recorder:
    """Collects the Tasks API signals sent during a test."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Any]] = []

    def __enter__(self) -> Recorder:
        for name, signal in self._signals():
            signal.connect(self._receiver(name), weak=False, dispatch_uid=f"rec-{name}")
        return self

    def __exit__(self, *exc: object) -> None:
        for name, signal in self._signals():
            signal.disconnect(dispatch_uid=f"rec-{name}")

    @staticmethod
    def _signals() -> list[tuple[str, Any]]:
        return [("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)]

    def _receiver(self, name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            self.sent.append((name, sender, task_result))

        return receive

    def names(self) -> list[str]:
        return [name for name, _, _ in self.sent]


# ---------------------------------------------------------------------------
# Configuration


def test_the_backend_is_hopper_and_supports_every_feature() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, HopperBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority
    assert isinstance(tasks.noop_task, HopperTask)


def test_the_database_option_defaults_to_hoppers_database(settings: Any) -> None:
    assert task_backends["default"].database == "default"
    settings.TASKS = {
        "default": {
            "BACKEND": "django_hopper.tasks.backend.HopperBackend",
            "OPTIONS": {"database": "other"},
        }
    }
    assert task_backends["default"].database == "other"


def test_check_reports_unknown_options_databases_and_unworked_queues(settings: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "django_hopper.tasks.backend.HopperBackend",
            "QUEUES": ["default", "reports"],
            "OPTIONS": {"database": "nope", "retries": 3, "max_attempts": 0},
        }
    }
    ids = sorted(m.id for m in task_backends["default"].check())
    assert ids == ["hopper.E701", "hopper.E702", "hopper.E703", "hopper.W701"]


def test_check_is_clean_when_hopper_works_every_queue(settings: Any) -> None:
    settings.HOPPER = {**settings.HOPPER, "QUEUES": {"default": 4, "queue_1": 1, "emails": 1}}
    assert task_backends["default"].check() == []


# ---------------------------------------------------------------------------
# Enqueue


def test_enqueue_inserts_a_job_of_the_tasks_import_path_with_hoppers_args(engine: Any) -> None:
    result = tasks.add.enqueue(2, b=3)
    row = job_of(engine, result)
    assert row.kind == "tests.tasks_backend.tasks.add" == tasks.add.module_path
    assert row.args == {"args": [2], "kwargs": {"b": 3}}
    assert row.state == "available"
    assert row.max_attempts == 1
    assert row.metadata == {
        "django_task": {
            "backend": "default",
            "takes_context": False,
            "priority": 0,
            "queue_name": "default",
            "run_after": None,
        }
    }
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == row.created_at
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert result.attempts == 0 and result.errors == []


def test_run_after_priority_and_queue_name_map_to_the_jobs_fields(engine: Any) -> None:
    when = timezone.now() + dt.timedelta(hours=1)
    result = tasks.add.using(run_after=when, priority=-40, queue_name="queue_1").enqueue(1, 1)
    row = job_of(engine, result)
    assert (row.scheduled_at, row.priority, row.queue) == (when, -40, "queue_1")
    assert row.state == "scheduled"
    assert result.status == TaskResultStatus.READY
    assert result.task.run_after == when and result.task.priority == -40


def test_max_attempts_comes_from_the_task_then_options_then_one(engine: Any) -> None:
    assert job_of(engine, tasks.add.enqueue(1, 1)).max_attempts == 1
    assert job_of(engine, tasks.flaky.enqueue(0)).max_attempts == 3
    assert job_of(engine, tasks.flaky.using(max_attempts=5).enqueue(0)).max_attempts == 5


@pytest.mark.django_db(transaction=True)
def test_a_task_enqueued_in_a_committed_transaction_exists_afterwards() -> None:
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.django_db(transaction=True)
def test_a_task_enqueued_in_a_rolled_back_transaction_never_existed() -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert tasks.add.get_result(result.id).status == TaskResultStatus.READY
        raise Abort
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)


def test_aenqueue_inserts_through_the_same_path(engine: Any) -> None:
    from asgiref.sync import async_to_sync

    result = async_to_sync(tasks.add.aenqueue)(4, 5)
    assert job_of(engine, result).args == {"args": [4, 5], "kwargs": {}}


def test_hopper_extras_from_the_task_decorator_reach_the_job(engine: Any) -> None:
    result = tasks.send_digest.enqueue()
    row = job_of(engine, result)
    assert (row.queue, row.priority, row.tags, row.unique_key) == ("emails", 7, ["mail"], "digest")
    assert row.metadata["django_task"]["options"] == {"unique_key": "digest", "tags": ["mail"]}
    assert tasks.send_digest.get_result(result.id) == result


def test_hopper_extras_through_using_and_hopper_options(engine: Any) -> None:
    lane = tasks.add.using(ordering_key="user:1", tags=["a", "b"], ttl=dt.timedelta(minutes=5))
    row = job_of(engine, lane.enqueue(1, 2))
    assert (row.ordering_key, row.tags) == ("user:1", ["a", "b"])
    assert row.expires_at is not None
    converted = hopper_options(tasks.add, partition_key="tenant-1")
    assert isinstance(converted, HopperTask)
    assert job_of(engine, converted.enqueue(1, 1)).partition_key == "tenant-1"
    with pytest.raises(TypeError, match="unknown task option"):
        tasks.add.using(colour="blue")


def test_a_unique_task_returns_the_live_job_instead_of_enqueueing_again(engine: Any) -> None:
    with Recorder() as rec:
        first = tasks.send_digest.enqueue()
        second = tasks.send_digest.enqueue()
    assert second.id == first.id
    assert rec.names() == ["enqueued"]


def test_enqueue_sends_task_enqueued_with_the_result(engine: Any) -> None:
    with Recorder() as rec:
        result = tasks.add.enqueue(1, 2)
    assert [(n, s) for n, s, _ in rec.sent] == [("enqueued", HopperBackend)]
    assert rec.sent[0][2] == result


# ---------------------------------------------------------------------------
# Validation


def test_validate_task_refuses_a_queue_not_in_queues() -> None:
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid for backend"):
        tasks.add.using(queue_name="nowhere")


def test_validate_task_refuses_a_queue_name_hopper_cannot_store() -> None:
    with pytest.raises(InvalidTask, match="queue_name"):
        tasks.flaky.using(queue_name="bad queue!")


def test_validate_task_refuses_functions_not_at_module_level() -> None:
    def local() -> None: ...

    with pytest.raises(InvalidTask, match="module level"):
        task()(local)


def test_validate_task_refuses_functions_in_main() -> None:
    def in_main() -> None: ...

    in_main.__module__ = "__main__"
    in_main.__qualname__ = "in_main"
    with pytest.raises(InvalidTask, match="__main__"):
        task()(in_main)


def test_validate_task_refuses_invalid_hopper_options() -> None:
    with pytest.raises(InvalidTask, match="unique_key"):
        tasks.add.using(unique_key="x" * 256)
    with pytest.raises(InvalidTask, match="max_attempts"):
        tasks.add.using(max_attempts=0)
    with pytest.raises(InvalidTask, match="unique_finished"):
        tasks.add.using(unique_key="k", unique_finished=["running"])


def test_enqueue_refuses_a_task_a_worker_could_not_import(engine: Any) -> None:
    shadow = task()(tasks.not_a_task)
    with pytest.raises(InvalidTask, match="importable"):
        shadow.enqueue()


def test_enqueue_refuses_arguments_that_are_not_json(engine: Any) -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(dt.datetime.now(), 1)
    with pytest.raises(ValueError, match="finite"):
        tasks.add.enqueue(float("nan"), 1)


# ---------------------------------------------------------------------------
# Results


def test_get_result_of_a_waiting_task_is_ready_and_equals_the_enqueued_result(
    engine: Any,
) -> None:
    result = tasks.add.using(priority=3).enqueue(1, 2)
    fetched = task_backends["default"].get_result(result.id)
    assert fetched == result
    assert fetched.status == TaskResultStatus.READY and not fetched.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = fetched.return_value


def test_get_result_of_a_claimed_task_is_running(engine: Any) -> None:
    result = tasks.add.enqueue(1, 2)
    (row,) = claim(engine)
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.started_at == result.last_attempted_at == row.attempted_at
    assert result.worker_ids == [str(row.attempted_by)] and result.attempts == 1
    assert result.finished_at is None


def test_get_result_of_an_unknown_or_foreign_id_does_not_exist(engine: Any) -> None:
    backend = task_backends["default"]
    for bad in [str(uuid.uuid4()), "123", 123, "not-a-uuid"]:
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(bad)
    # A plain hopper job is no task result.
    plain = engine.job_insert_many([JobInsertParams(kind="tests.testapp.jobs.add")])[0].job
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(plain.id))
    # A task of another backend alias is not this backend's.
    other = tasks.flaky.enqueue(0)
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(other.id)
    assert task_backends["retrying"].get_result(other.id) == other


def test_a_canceled_waiting_task_is_failed_with_hoppers_cancel_error(engine: Any) -> None:
    from django_hopper.engine.params import JobCancelParams

    result = tasks.add.enqueue(1, 2)
    engine.job_cancel(JobCancelParams(id=uuid.UUID(result.id)))
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_hopper.exceptions.JobCanceled"
    assert result.finished_at is not None and result.started_at is None


def test_task_error_reads_the_exception_class_from_the_traceback() -> None:
    from django_hopper.types import AttemptError

    trace = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "KeyError: 'a'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n'
        "django.core.exceptions.ValidationError: ['bad\n"
        "value']\n"
        "a note\n"
    )
    err = task_error(AttemptError(at=None, attempt=1, error="ValidationError: x", trace=trace))
    assert err.exception_class_path == "django.core.exceptions.ValidationError"
    bare = task_error(AttemptError(at=None, attempt=1, error="x", trace="KeyError: 'a'\n"))
    assert bare.exception_class is KeyError
    timeout = task_error(AttemptError(at=None, attempt=1, error="timed out after 2s"))
    assert timeout.exception_class_path == "django_hopper.tasks.errors.HopperTaskError"
    assert timeout.traceback == "timed out after 2s\n"


# ---------------------------------------------------------------------------
# Running under hopper's worker


def test_resolve_runs_tasks_through_the_resolver_the_app_registers() -> None:
    """The worker's ``registry.resolve`` turns a task's kind into a runnable job function."""
    from django_hopper.registry import resolve, resolvers
    from django_hopper.tasks_compat import job_function_for

    assert job_function_for in resolvers  # registered by the app's ready
    fn = resolve(tasks.add.module_path)
    assert fn.kind == tasks.add.module_path and fn.takes_context


def test_the_earlier_import_path_of_the_backend_still_works(settings: Any) -> None:
    from django_hopper import tasks as canonical
    from django_hopper import tasks_backend

    assert tasks_backend.HopperBackend is canonical.HopperBackend
    assert tasks_backend.job_context is canonical.job_context
    settings.TASKS = {"old": {"BACKEND": "django_hopper.tasks_backend.HopperBackend"}}
    assert isinstance(task_backends["old"], canonical.HopperBackend)


def test_the_worker_completes_a_task_and_get_result_has_its_value(
    tx_engine: Any, run_worker: Any
) -> None:
    result = tasks.add.enqueue(2, 3)
    assert run_worker() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 5
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert tasks.CALLS == [("add", 2, 3)]


def test_the_worker_runs_async_tasks(tx_engine: Any, run_worker: Any) -> None:
    result = tasks.add_async.enqueue(20, 22)
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42


def test_a_failed_task_records_the_exception_class_and_traceback(
    tx_engine: Any, run_worker: Any
) -> None:
    result = tasks.failing_task_value_error.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: This Task failed due to ValueError\n")
    assert result.finished_at is not None


def test_tasks_and_hopper_jobs_run_side_by_side(tx_engine: Any, run_worker: Any) -> None:
    from tests.testapp import jobs

    handle = jobs.add.enqueue(1, 2)
    result = tasks.add.enqueue(3, 4)
    assert run_worker() == 2
    assert tx_engine.job_get(handle.id).state == "completed"
    result.refresh()
    assert result.return_value == 7


def test_a_task_in_another_queue_runs_in_priority_order(tx_engine: Any, run_worker: Any) -> None:
    low = tasks.add.using(queue_name="queue_1", priority=-5).enqueue(0, 1)
    high = tasks.add.using(queue_name="queue_1", priority=50).enqueue(0, 2)
    (first, second) = claim(tx_engine, "queue_1")
    assert (str(first.id), str(second.id)) == (high.id, low.id)


def test_a_deferred_task_does_not_run_before_run_after(tx_engine: Any, run_worker: Any) -> None:
    result = tasks.add.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(1, 1)
    assert run_worker() == 0
    result.refresh()
    assert result.status == TaskResultStatus.READY


def test_context_carries_the_running_result_and_hoppers_job_context(
    tx_engine: Any, run_worker: Any
) -> None:
    result = tasks.describe_context.enqueue()
    run_worker()
    result.refresh()
    assert result.return_value == {
        "id": result.id,
        "attempt": 1,
        "status": "RUNNING",
        "backend": "default",
        "hopper_job_id": result.id,
    }
    with pytest.raises(LookupError):
        job_context()


def test_max_attempts_from_options_retries_with_hoppers_backoff(
    tx_engine: Any, run_worker: Any
) -> None:
    result = tasks.flaky.enqueue(1)
    with Recorder() as rec:
        run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.READY  # "ready to be executed again"
    assert [e.exception_class for e in result.errors] == [RuntimeError]
    assert rec.names() == ["started"]  # a retried failure does not finish the task
    tx_engine.job_retry(JobRetryParams(id=uuid.UUID(result.id)))
    with Recorder() as rec:
        run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "succeeded on attempt 2"
    assert result.attempts == 2 and len(result.errors) == 1
    assert rec.names() == ["started", "finished"]


def test_the_worker_sends_task_started_and_task_finished(tx_engine: Any, run_worker: Any) -> None:
    ok = tasks.add.enqueue(1, 1)
    bad = tasks.failing_task_value_error.enqueue()
    with Recorder() as rec:
        run_worker()
    by_id: dict[str, list[tuple[str, Any]]] = {}
    for name, sender, result in rec.sent:
        assert sender is HopperBackend
        by_id.setdefault(result.id, []).append((name, result.status))
    assert by_id[ok.id] == [
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    assert by_id[bad.id] == [
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.FAILED),
    ]
    finished = next(r for n, _, r in rec.sent if n == "finished" and r.id == bad.id)
    assert finished.errors[0].exception_class is ValueError


def test_task_finished_carries_the_outcome_get_result_shows_once_written(
    tx_engine: Any, run_worker: Any
) -> None:
    finished: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    task_finished.connect(receiver, weak=False, dispatch_uid="outcome")
    try:
        result = tasks.add.enqueue(1, 1)
        run_worker()
    finally:
        task_finished.disconnect(dispatch_uid="outcome")
    (sent,) = finished
    stored = tasks.add.get_result(result.id)
    assert (sent.status, sent.return_value) == (stored.status, stored.return_value)
    assert (sent.id, sent.args, sent.attempts) == (stored.id, stored.args, stored.attempts)


def test_hopper_worker_burst_runs_tasks(tx_engine: Any) -> None:
    from django.core.management import call_command

    result = tasks.add.enqueue(5, 6)
    # A clean burst returns normally (a failing one raises CommandError).
    call_command("hopper_worker", "--burst", "--no-maintenance", "--queues", "default:2")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 11


# ---------------------------------------------------------------------------
# Errors a project catches and reads


def _format(exc: BaseException) -> str:
    import traceback

    try:
        raise exc
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def test_task_error_reads_an_exception_groups_own_class() -> None:
    from django_hopper.types import AttemptError

    group = ExceptionGroup("two failed", [ValueError("one"), KeyError("two")])
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [TypeError("t")])])
    chained = _format(BaseExceptionGroup("after", [KeyboardInterrupt()]))
    try:
        try:
            raise KeyError("first")
        except KeyError as exc:
            raise ExceptionGroup("while handling", [ValueError("v")]) from exc
    except ExceptionGroup as exc:
        caused = _format(exc)
    for trace, expected in [
        (_format(group), "builtins.ExceptionGroup"),
        (_format(nested), "builtins.ExceptionGroup"),
        (chained, "builtins.BaseExceptionGroup"),
        (caused, "builtins.ExceptionGroup"),
        # A group formatted without a traceback has no header, only its margin.
        ("".join(__import__("traceback").format_exception(group)), "builtins.ExceptionGroup"),
    ]:
        err = task_error(AttemptError(at=None, attempt=1, error="x", trace=trace))
        assert err.exception_class_path == expected, trace


def test_enqueue_refuses_a_nul_character_naming_the_argument_on_every_engine(
    engine: Any,
) -> None:
    from django_hopper.exceptions import InvalidJob
    from django_hopper.models import Job

    for args, kwargs, field in [
        (("a\x00b", 1), {}, "args[0]"),
        ((1,), {"b": ["ok", "\x00"]}, "kwargs['b'][1]"),
        ((1,), {"b\x00": 2}, "kwargs"),
    ]:
        with pytest.raises(InvalidJob, match="NUL character") as info:
            tasks.add.enqueue(*args, **kwargs)
        assert info.value.field == field
    assert not Job.objects.exists()


def test_hoppers_database_errors_are_djangos_database_errors() -> None:
    import django.db

    from django_hopper.exceptions import DatabaseError, DatabaseUnavailable, HopperError

    with pytest.raises(django.db.DatabaseError):
        raise DatabaseError("the statement failed")
    with pytest.raises(django.db.OperationalError):
        raise DatabaseUnavailable("the connection was lost")
    assert issubclass(DatabaseUnavailable, HopperError)


def test_get_result_of_a_task_whose_module_is_gone_reads_as_that_task(engine: Any) -> None:
    from django_hopper.models import Job

    result = tasks.add.enqueue(1, 2)
    stale = "tests.tasks_backend.renamed_module.add"
    Job.objects.filter(id=uuid.UUID(result.id)).update(kind=stale)
    got = task_backends["default"].get_result(result.id)
    assert got.status == TaskResultStatus.READY
    assert got.task.module_path == stale and got.args == [1, 2]
    with pytest.raises(ImportError, match="renamed_module"):
        got.task.call(1, 2)


def test_get_result_reads_a_task_whose_queue_left_queues(engine: Any, settings: Any) -> None:
    result = tasks.add.using(queue_name="queue_1").enqueue(1, 2)
    settings.TASKS = {**tasks.TASKS, "default": {**tasks.TASKS["default"], "QUEUES": ["default"]}}
    got = task_backends["default"].get_result(result.id)
    assert got.task.queue_name == "queue_1" and got.status == TaskResultStatus.READY


def test_a_failure_hopper_decided_is_logged_with_its_reason(engine: Any) -> None:
    import unittest

    from django_hopper.engine.params import JobCancelParams
    from django_hopper.tasks import announce_finished
    from django_hopper.tasks_compat import NAMESPACE

    result = tasks.add.enqueue(1, 2)
    engine.job_cancel(JobCancelParams(id=uuid.UUID(result.id)))
    row = job_of(engine, result)
    with unittest.TestCase().assertLogs(NAMESPACE, level="ERROR") as captured:
        assert announce_finished([row]) == 1
    (line,) = captured.output
    assert "state=FAILED" in line and "HopperTaskError: canceled" in line
