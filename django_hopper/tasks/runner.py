"""Running a Django task in hopper's worker: the job function a task's kind resolves to.

``django_hopper.registry.resolve`` asks its registered resolvers for a
module attribute that is not a ``@job`` function; the one the app's
``ready`` registers (``tasks_compat.job_function_for``) answers for a
``Task`` with :func:`job_function_for_task`: a
:class:`~django_hopper.jobs.JobFunction` that builds the task's context,
sends ``task_started``, calls the task's function and returns its value as
Django's backends normalize it.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from django_hopper import validation
from django_hopper.jobs import JobFunction
from django_hopper.tasks.backend import (
    DEFAULT_MAX_ATTEMPTS,
    HopperBackend,
    hopper_backend,
    task_spec,
)
from django_hopper.tasks_compat import (
    InvalidTask,
    Task,
    TaskContext,
    TaskResult,
    normalize_json,
    task_backends,
    task_started,
)

if TYPE_CHECKING:
    from django_hopper.context import JobContext

#: The hopper context of the task attempt running in this thread or asyncio task.
_current_context: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "hopper_task_context", default=None
)


_job_functions: dict[str, tuple[Task, JobFunction[Any, Any]]] = {}


def job_function_for_task(task: Task) -> JobFunction[Any, Any]:
    """Return the job function the worker runs for a Django Task.

    It takes hopper's job context (to build the Task's context and result),
    sends ``task_started``, calls the task's function (with a ``TaskContext``
    when the task takes one) and returns its value normalized to JSON as
    Django's backends do, so a value that is not JSON fails the attempt with
    Django's TypeError. Cached per task object.
    """
    cached = _job_functions.get(task.module_path)
    if cached is not None and cached[0] is task:
        return cached[1]
    backend = hopper_backend(task.backend)
    options = backend.options if backend is not None else {}
    timeout = getattr(task, "timeout", None) or options.get("timeout")
    archive = getattr(task, "archive", None)
    if archive is None:
        archive = options.get("archive")
    max_attempts = getattr(task, "max_attempts", None) or options.get(
        "max_attempts", DEFAULT_MAX_ATTEMPTS
    )
    fn: JobFunction[Any, Any] = JobFunction(
        _async_runner(task) if _is_async(task) else _sync_runner(task),
        kind=task.module_path,
        queue=task.queue_name,
        priority=task.priority,
        max_attempts=max_attempts,
        timeout=float(timeout) if timeout else None,
        takes_context=True,
        archive=archive,
    )
    _job_functions[task.module_path] = (task, fn)
    return fn


def job_context() -> JobContext:
    """Return the hopper context of the task attempt running here.

    For task code that wants hopper's extras (progress, attempt logs,
    cooperative cancellation) without changing its signature. Raises
    LookupError outside a task run by hopper's worker.
    """
    context = _current_context.get()
    if context is None:
        raise LookupError("no hopper task is running in this thread or asyncio task")
    return context


def _is_async(task: Task) -> bool:
    return inspect.iscoroutinefunction(task.func)


def _start(task: Task, context: JobContext) -> tuple[HopperBackend, TaskResult]:
    """Return the backend and RUNNING result of an attempt, and send ``task_started``."""
    spec = task_spec(context.job) or {}
    alias = spec.get("backend", task.backend)
    backend = task_backends[alias]
    if not isinstance(backend, HopperBackend):
        raise InvalidTask(f"TASKS[{alias!r}] is not a HopperBackend in this worker's settings.")
    result = backend.result_from_row(context.job)
    task_started.send(type(backend), task_result=result)
    return backend, result


def _call_args(task: Task, result: TaskResult, args: Iterable[Any]) -> list[Any]:
    if task.takes_context:
        return [TaskContext(task_result=result), *args]
    return list(args)


def _named_after(run_task: Any, task: Task) -> Any:
    """Give a runner the name and module of the task's function, and return it."""
    run_task.__qualname__ = run_task.__name__ = task.func.__name__
    run_task.__module__ = task.func.__module__
    return run_task


def _return_value(value: Any) -> Any:
    """Return a task's value as it will be stored, or raise why it cannot be.

    Django's normalization first (its TypeError "Unsupported type", as on
    every backend), then hopper's JSON rules, so that a value one engine
    cannot store (a NUL character) fails the attempt the same on both.
    """
    return validation.json_normalize(normalize_json(value), "the task's return value")


def _sync_runner(task: Task) -> Any:
    def run_task(context: JobContext, *args: Any, **kwargs: Any) -> Any:
        token = _current_context.set(context)
        try:
            _, result = _start(task, context)
            value = task.func(*_call_args(task, result, args), **kwargs)
            return _return_value(value)
        finally:
            _current_context.reset(token)

    return _named_after(run_task, task)


def _async_runner(task: Task) -> Any:
    async def run_task(context: JobContext, *args: Any, **kwargs: Any) -> Any:
        token = _current_context.set(context)
        try:
            # Receivers are sync code (they may use the ORM): run them outside the loop.
            _, result = await sync_to_async(_start, thread_sensitive=True)(task, context)
            value = await task.func(*_call_args(task, result, args), **kwargs)
            return _return_value(value)
        finally:
            _current_context.reset(token)

    return _named_after(run_task, task)
