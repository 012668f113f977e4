"""Django's own task-backend tests (``tests/tasks/`` of Django 6.1.3), run against hopper.

Ported from the Django source distribution: ``test_tasks.py`` (the Tasks API
against a backend), the enqueue-side assertions of ``test_dummy_backend.py``
(a backend that stores and does not run) and the run-side assertions of
``test_immediate_backend.py`` (a backend that runs the task), with hopper's
worker doing the running. Each test keeps Django's name; assertions that
depend on Dummy/Immediate internals (``.results``, ``.clear()``, running inside
``enqueue``, NotImplementedError for results) are left out, and
``docs/django-tasks.md`` lists them. Namespace-neutral: it runs on Django 6
(``django.tasks``) and on the backport (``django_tasks``).
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import unittest
from datetime import datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone
from django.utils.module_loading import import_string

from django_hopper.tasks import HopperBackend, HopperTask
from django_hopper.tasks_compat import (
    DEFAULT_TASK_QUEUE_NAME,
    NAMESPACE,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task,
    task_backends,
)
from tests.tasks_backend import tasks as test_tasks

#: Django's tests capture logs with ``assertLogs``; so do these, with the same output format.
assert_logs = unittest.TestCase().assertLogs


@pytest.fixture
def default_task_backend() -> Any:
    return task_backends["default"]


# ---------------------------------------------------------------------------
# test_tasks.py: TaskTestCase


def test_using_correct_backend(default_task_backend: Any) -> None:
    assert isinstance(default_task_backend, HopperBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.options == {}


def test_task_decorator() -> None:
    assert isinstance(test_tasks.noop_task, Task)
    assert isinstance(test_tasks.noop_task_async, Task)
    assert isinstance(test_tasks.noop_task_from_bare_decorator, Task)


def test_enqueue_task(db: None) -> None:
    result = test_tasks.noop_task.enqueue()
    assert result.status == TaskResultStatus.READY
    assert result.task == test_tasks.noop_task
    assert result.args == []
    assert result.kwargs == {}


def test_enqueue_task_async(db: None) -> None:
    result = async_to_sync(test_tasks.noop_task.aenqueue)()
    assert result.status == TaskResultStatus.READY
    assert result.task == test_tasks.noop_task
    assert result.args == []
    assert result.kwargs == {}


def test_enqueue_with_invalid_argument(db: None) -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        test_tasks.noop_task.enqueue(datetime.now())


def test_aenqueue_with_invalid_argument(db: None) -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        async_to_sync(test_tasks.noop_task.aenqueue)(datetime.now())


def test_using_priority() -> None:
    assert test_tasks.noop_task.priority == 0
    assert test_tasks.noop_task.using(priority=1).priority == 1
    assert test_tasks.noop_task.priority == 0


def test_using_queue_name() -> None:
    assert test_tasks.noop_task.queue_name == DEFAULT_TASK_QUEUE_NAME
    assert test_tasks.noop_task.using(queue_name="queue_1").queue_name == "queue_1"
    assert test_tasks.noop_task.queue_name == DEFAULT_TASK_QUEUE_NAME


def test_using_run_after() -> None:
    now = timezone.now()
    assert test_tasks.noop_task.run_after is None
    assert test_tasks.noop_task.using(run_after=now).run_after == now
    assert test_tasks.noop_task.run_after is None


def test_using_unknown_backend() -> None:
    with pytest.raises(
        InvalidTaskBackend, match=re.escape("The connection 'unknown' doesn't exist.")
    ):
        test_tasks.noop_task.using(backend="unknown")


def test_using_missing_backend(settings: Any) -> None:
    settings.TASKS = {**test_tasks.TASKS, "missing": {"BACKEND": "does.not.exist"}}
    assert test_tasks.noop_task.backend == "default"
    with pytest.raises(
        InvalidTaskBackend,
        match=re.escape("Could not find backend 'does.not.exist': No module named 'does'"),
    ):
        test_tasks.noop_task.using(backend="missing")


def test_using_creates_new_instance() -> None:
    new_task = test_tasks.noop_task.using()
    assert new_task == test_tasks.noop_task
    assert new_task is not test_tasks.noop_task


def test_chained_using() -> None:
    now = timezone.now()
    run_after_task = test_tasks.noop_task.using(run_after=now)
    assert run_after_task.run_after == now
    priority_task = run_after_task.using(priority=10)
    assert priority_task.priority == 10
    assert priority_task.run_after == now
    assert run_after_task.priority == 0


def test_refresh_result(db: None) -> None:
    result = async_to_sync(test_tasks.noop_task.aenqueue)()
    original_result = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == original_result
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == original_result


def test_naive_datetime() -> None:
    with pytest.raises(InvalidTask, match=re.escape("run_after must be an aware datetime.")):
        test_tasks.noop_task.using(run_after=datetime.now())


def test_invalid_priority() -> None:
    message = (
        f"priority must be a whole number between {TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}."
    )
    for bad in (-101, 101, 3.1):
        with pytest.raises(InvalidTask) as info:
            test_tasks.noop_task.using(priority=bad)
        assert message in str(info.value)
    test_tasks.noop_task.using(priority=100)
    test_tasks.noop_task.using(priority=-100)
    test_tasks.noop_task.using(priority=0)


def test_unknown_queue_name() -> None:
    with pytest.raises(InvalidTask, match=re.escape("Queue 'queue-2' is not valid for backend.")):
        test_tasks.noop_task.using(queue_name="queue-2")
    # Validation is bypassed when the backend QUEUES is an empty list.
    assert test_tasks.noop_task.using(queue_name="queue-2", backend="retrying").queue_name == (
        "queue-2"
    )


def test_call_task() -> None:
    assert test_tasks.calculate_meaning_of_life.call() == 42


def test_call_task_async() -> None:
    assert async_to_sync(test_tasks.calculate_meaning_of_life.acall)() == 42


def test_call_async_task() -> None:
    assert async_to_sync(test_tasks.noop_task_async.acall)() is None


def test_call_async_task_sync() -> None:
    assert test_tasks.noop_task_async.call() is None


def test_get_result(db: None, default_task_backend: Any) -> None:
    result = default_task_backend.enqueue(test_tasks.noop_task, (), {})
    new_result = test_tasks.noop_task.get_result(result.id)
    assert result == new_result


def test_get_result_async(db: None, default_task_backend: Any) -> None:
    result = async_to_sync(default_task_backend.aenqueue)(test_tasks.noop_task, (), {})
    new_result = async_to_sync(test_tasks.noop_task.aget_result)(result.id)
    assert result == new_result


def test_get_missing_result(db: None) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        test_tasks.noop_task.get_result("123")
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(test_tasks.noop_task.aget_result)("123")


def test_get_incorrect_result(db: None, default_task_backend: Any) -> None:
    result = default_task_backend.enqueue(test_tasks.noop_task_async, (), {})
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        test_tasks.noop_task.get_result(result.id)


def test_get_incorrect_result_async(db: None, default_task_backend: Any) -> None:
    result = async_to_sync(default_task_backend.aenqueue)(test_tasks.noop_task_async, (), {})
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        async_to_sync(test_tasks.noop_task.aget_result)(result.id)


def test_invalid_function() -> None:
    def local() -> None: ...

    for invalid_function in [any, local]:
        with pytest.raises(
            InvalidTask, match=re.escape("Task function must be defined at a module level.")
        ):
            task()(invalid_function)


def test_get_backend() -> None:
    assert test_tasks.noop_task.backend == "default"
    assert isinstance(test_tasks.noop_task.get_backend(), HopperBackend)
    other_task = test_tasks.noop_task.using(backend="retrying")
    assert other_task.backend == "retrying"
    assert isinstance(other_task.get_backend(), HopperBackend)
    assert other_task.get_backend() is not test_tasks.noop_task.get_backend()


def test_name() -> None:
    assert test_tasks.noop_task.name == "noop_task"
    assert test_tasks.noop_task_async.name == "noop_task_async"


def test_module_path() -> None:
    assert test_tasks.noop_task.module_path == "tests.tasks_backend.tasks.noop_task"
    assert import_string(test_tasks.noop_task.module_path) is test_tasks.noop_task
    assert import_string(test_tasks.noop_task_async.module_path) is test_tasks.noop_task_async


needs_task_pickling = pytest.mark.skipif(
    NAMESPACE != "django.tasks",
    reason="the backport's Task cannot be pickled on any backend (Django 6 added Task.__reduce__)",
)


@needs_task_pickling
def test_pickle_task() -> None:
    unpickled_task = pickle.loads(pickle.dumps(test_tasks.noop_task))
    assert unpickled_task == test_tasks.noop_task


@needs_task_pickling
def test_pickle_task_result(db: None) -> None:
    result = test_tasks.noop_task.enqueue()
    assert pickle.loads(pickle.dumps(result)) == result


needs_task_reconstruct = pytest.mark.skipif(
    NAMESPACE != "django.tasks", reason="Task._reconstruct (unpickling) is Django 6's"
)


@needs_task_reconstruct
def test_unpickle_arbitrary_string() -> None:
    msg = "Expected 'does.not.exist.fake_task' to point to a Task instance."
    with pytest.raises(ValueError, match=re.escape(msg)):
        Task._reconstruct({"func": "does.not.exist.fake_task"})


@needs_task_reconstruct
def test_unpickle_non_task_object() -> None:
    msg = "Expected 'builtins.any' to point to a Task instance."
    with pytest.raises(ValueError, match=re.escape(msg)):
        Task._reconstruct({"func": "builtins.any"})


def test_task_error_invalid_exception(tx_engine: Any, run_worker: Any) -> None:
    with assert_logs(NAMESPACE):
        result = test_tasks.failing_task_value_error.enqueue()
        run_worker()
    result.refresh()
    assert len(result.errors) == 1
    object.__setattr__(result.errors[0], "exception_class_path", "subprocess.run")
    with pytest.raises(
        ValueError, match=re.escape("'subprocess.run' does not reference a valid exception.")
    ):
        _ = result.errors[0].exception_class


def test_task_error_unknown_module(tx_engine: Any, run_worker: Any) -> None:
    with assert_logs(NAMESPACE):
        result = test_tasks.failing_task_value_error.enqueue()
        run_worker()
    result.refresh()
    assert len(result.errors) == 1
    object.__setattr__(result.errors[0], "exception_class_path", "does.not.exist")
    with pytest.raises(ImportError):
        _ = result.errors[0].exception_class


def test_no_backends(settings: Any) -> None:
    settings.TASKS = {}
    with pytest.raises(InvalidTaskBackend):
        test_tasks.noop_task.enqueue()


@pytest.mark.skipif(
    NAMESPACE != "django.tasks", reason="the backport's @task does not check run_after"
)
def test_run_after_in_decorator() -> None:
    msg = "run_after cannot be defined statically with the @task decorator."
    with pytest.raises(TypeError, match=re.escape(msg)):
        task(run_after=timezone.now())(test_tasks.calculate_meaning_of_life.func)


def test_takes_context_without_taking_context() -> None:
    with pytest.raises(
        InvalidTask,
        match=re.escape("Task takes context but does not have a first argument of 'context'."),
    ):
        task(takes_context=True)(test_tasks.calculate_meaning_of_life.func)


# ---------------------------------------------------------------------------
# test_dummy_backend.py: a stored, not yet run, task


def test_dummy_enqueue_task(db: None) -> None:
    for t in [test_tasks.noop_task, test_tasks.noop_task_async]:
        result = t.enqueue(1, two=3)
        assert result.status == TaskResultStatus.READY
        assert result.is_finished is False
        assert result.started_at is None
        assert result.last_attempted_at is None
        assert result.finished_at is None
        with pytest.raises(ValueError, match="Task has not finished yet"):
            _ = result.return_value
        assert result.task == t
        assert result.args == [1]
        assert result.kwargs == {"two": 3}
        assert result.attempts == 0


def test_dummy_enqueue_logs(db: None) -> None:
    with assert_logs(NAMESPACE, level="DEBUG") as captured_logs:
        result = test_tasks.noop_task.enqueue()
    assert len(captured_logs.output) == 1
    assert "enqueued" in captured_logs.output[0]
    assert result.id in captured_logs.output[0]


def test_dummy_errors(db: None) -> None:
    assert test_tasks.noop_task.enqueue().errors == []


def test_dummy_takes_context(db: None) -> None:
    assert test_tasks.get_task_id.enqueue().status == TaskResultStatus.READY


def test_dummy_check(default_task_backend: Any, settings: Any) -> None:
    settings.HOPPER = {**settings.HOPPER, "QUEUES": {"default": 1, "queue_1": 1, "emails": 1}}
    assert list(task_backends["default"].check()) == []


def test_validate_on_enqueue(settings: Any) -> None:
    task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="queue_1")
    settings.TASKS = {
        "default": {
            "BACKEND": "django_hopper.tasks.backend.HopperBackend",
            "QUEUES": ["queue-1"],
        }
    }
    with pytest.raises(InvalidTask, match="Queue 'queue_1' is not valid for backend"):
        task_with_custom_queue_name.enqueue()
    with pytest.raises(InvalidTask, match="Queue 'queue_1' is not valid for backend"):
        async_to_sync(task_with_custom_queue_name.aenqueue)()


# ---------------------------------------------------------------------------
# test_immediate_backend.py: the run, by hopper's worker


def test_immediate_enqueue_task(tx_engine: Any, run_worker: Any) -> None:
    results = [t.enqueue(1, two=3) for t in [test_tasks.noop_task, test_tasks.noop_task_async]]
    run_worker()
    for t, result in zip([test_tasks.noop_task, test_tasks.noop_task_async], results, strict=True):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.is_finished is True
        assert result.started_at is not None
        assert result.last_attempted_at is not None
        assert result.finished_at is not None
        assert result.started_at >= result.enqueued_at
        assert result.finished_at >= result.started_at
        assert result.return_value is None
        assert result.task == t
        assert result.args == [1]
        assert result.kwargs == {"two": 3}
        assert result.attempts == 1


@pytest.mark.parametrize(
    ("name", "exception", "message"),
    [
        ("failing_task_value_error", ValueError, "This Task failed due to ValueError"),
        ("failing_task_system_exit", SystemExit, "This Task failed due to SystemExit"),
    ],
)
def test_catches_exception(
    tx_engine: Any, run_worker: Any, name: str, exception: type, message: str
) -> None:
    t = getattr(test_tasks, name)
    with assert_logs(NAMESPACE, level="ERROR") as captured_logs:
        result = t.enqueue()
        run_worker()
    assert len(captured_logs.output) == 1
    assert message in captured_logs.output[0]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result.is_finished is True
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result.errors[0].exception_class is exception
    assert result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
    assert result.task == t
    assert result.args == []
    assert result.kwargs == {}


def test_complex_exception(tx_engine: Any, run_worker: Any) -> None:
    with assert_logs(NAMESPACE, level="ERROR"):
        result = test_tasks.complex_exception.enqueue()
        run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback
    assert result.task == test_tasks.complex_exception


def test_complex_return_value(tx_engine: Any, run_worker: Any) -> None:
    with assert_logs(NAMESPACE, level="ERROR"):
        result = test_tasks.complex_return_value.enqueue()
        run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at >= result.started_at >= result.enqueued_at
    assert result._return_value is None
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback


def test_result(tx_engine: Any, run_worker: Any, default_task_backend: Any) -> None:
    result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_result_async(tx_engine: Any, run_worker: Any, default_task_backend: Any) -> None:
    result = async_to_sync(default_task_backend.aenqueue)(
        test_tasks.calculate_meaning_of_life, [], {}
    )
    run_worker()
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_takes_context(tx_engine: Any, run_worker: Any) -> None:
    result = test_tasks.get_task_id.enqueue()
    run_worker()
    result.refresh()
    assert result.return_value == result.id


def test_context(tx_engine: Any, run_worker: Any) -> None:
    result = test_tasks.test_context.enqueue(1)
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_enqueue_logs(tx_engine: Any, run_worker: Any) -> None:
    with assert_logs(NAMESPACE, level="DEBUG") as captured_logs:
        result = test_tasks.noop_task.enqueue()
        run_worker()
    assert len(captured_logs.output) == 3
    assert "enqueued" in captured_logs.output[0]
    assert result.id in captured_logs.output[0]
    assert "state=RUNNING" in captured_logs.output[1]
    assert result.id in captured_logs.output[1]
    assert "state=SUCCESSFUL" in captured_logs.output[2]
    assert result.id in captured_logs.output[2]


def test_failed_logs(tx_engine: Any, run_worker: Any) -> None:
    with assert_logs(NAMESPACE, level="DEBUG") as captured_logs:
        result = test_tasks.failing_task_value_error.enqueue()
        run_worker()
    assert len(captured_logs.output) == 3
    assert "state=RUNNING" in captured_logs.output[1]
    assert result.id in captured_logs.output[1]
    assert "state=FAILED" in captured_logs.output[2]
    assert result.id in captured_logs.output[2]


def test_successful_task_no_none_type_in_logs(tx_engine: Any, run_worker: Any) -> None:
    with assert_logs(NAMESPACE, level="DEBUG") as captured_logs:
        result = test_tasks.noop_task.enqueue()
        run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    for log_output in captured_logs.output:
        assert "NoneType" not in log_output


# ---------------------------------------------------------------------------
# test_custom_backend.py: CustomTaskTestCase (the task_class extension point)


def test_custom_task_default_values() -> None:
    my_task = task()(test_tasks.noop_task.func)
    assert isinstance(my_task, HopperTask)
    assert my_task.unique_key is None and my_task.tags == ()


def test_custom_task_with_standard_and_custom_values() -> None:
    my_task = task(priority=10, queue_name="queue_1", unique_key="k", tags=["x"])(
        test_tasks.noop_task.func
    )
    assert isinstance(my_task, HopperTask)
    assert (my_task.priority, my_task.queue_name) == (10, "queue_1")
    assert (my_task.unique_key, my_task.tags) == ("k", ("x",))
    assert my_task.takes_context is False
    assert my_task.run_after is None


def test_custom_task_invalid_kwarg() -> None:
    with pytest.raises(TypeError):
        task(unknown_param=123)(test_tasks.noop_task.func)
