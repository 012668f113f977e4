"""Hopper's signals translated into the Tasks API's: ``task_finished`` for every ending.

The worker sends hopper's ``job_finished`` as an attempt ends; hopper's
services and ``cancel_job`` send ``jobs_ended`` for the jobs they end outside
an attempt. The receivers here (connected when this module is imported, as
the app's ``ready`` does when a ``TASKS`` entry names hopper's backend) send
``task_finished`` for the tasks among them, from sync code and, for a failed
task, while its exception is being handled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import logging
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections
from django.utils import timezone

from django_hopper.exceptions import UnknownJobKind
from django_hopper.signals import job_finished, jobs_ended
from django_hopper.tasks.backend import hopper_backend, task_spec
from django_hopper.tasks.errors import HopperTaskError
from django_hopper.tasks_compat import (
    BaseTaskBackend,
    TaskResult,
    TaskResultStatus,
    task_finished,
)
from django_hopper.types import AttemptError, RescueReason

if TYPE_CHECKING:
    from django_hopper.types import JobRow

logger = logging.getLogger("django_hopper.tasks")


def _on_job_finished(
    sender: Any,
    job: JobRow,
    state: str,
    error: BaseException | None = None,
    output: Any = None,
    **kwargs: Any,
) -> None:
    """Send ``task_finished`` when an attempt ends a task: it succeeded, or failed for good.

    Hopper's worker sends ``job_finished`` as an attempt ends, before it
    writes the result (results are written in batches), so the TaskResult is
    built from the claimed job plus the outcome, with no database read: it
    shows what ``get_result`` returns once the result is written. A failed
    attempt that hopper will retry does not finish the task, so nothing is
    sent then (the next attempt sends ``task_started`` again).
    """
    spec = task_spec(job)
    if spec is None or state not in ("completed", "canceled", "discarded"):
        return
    backend = hopper_backend(str(spec.get("backend")))
    if backend is None:
        return
    now = timezone.now()
    if state == "completed":
        row = dataclasses.replace(job, state=state, output=output, finalized_at=now)
    else:
        by = job.attempted_by
        if isinstance(error, UnknownJobKind):  # recorded as its message, as the worker does
            failure = AttemptError(at=now, attempt=job.attempt, error=str(error), by=by)
        elif error is not None:
            message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            trace = "".join(traceback.format_exception(error))
            failure = AttemptError(at=now, attempt=job.attempt, error=message, trace=trace, by=by)
        else:
            rescue = RescueReason.CANCELED if state == "canceled" else ""
            failure = AttemptError(at=now, attempt=job.attempt, error=state, rescue=rescue, by=by)
        row = dataclasses.replace(job, state=state, errors=[*job.errors, failure], finalized_at=now)
    result = backend.result_from_row(row)
    _outside_event_loop(send_finished, type(backend), result, error)


def send_finished(
    sender: type[BaseTaskBackend], result: TaskResult, error: BaseException | None = None
) -> None:
    """Send ``task_finished``; for a failed task, while its exception is being handled.

    Django's backends send it from their ``except`` block, and its logging
    receiver logs the failure with ``logger.exception``, which prints the
    exception being handled. So the exception is raised and caught around the
    send: the task's own exception when the caller has it, else a
    HopperTaskError carrying the recorded reason (a timeout, a rescue, a
    cancel). The exception's traceback and context are left as they were.
    """
    if result.status != TaskResultStatus.FAILED:
        task_finished.send(sender, task_result=result)
        return
    exc = error if error is not None else _stand_in_error(result)
    saved = (exc.__traceback__, exc.__context__)
    try:
        raise exc
    except BaseException:
        task_finished.send(sender, task_result=result)
    finally:
        exc.__traceback__, exc.__context__ = saved


def _stand_in_error(result: TaskResult) -> BaseException:
    """Return the exception that stands for a failure hopper recorded without one."""
    if not result.errors:
        return HopperTaskError("the task failed")
    last = result.errors[-1]
    lines = [line for line in last.traceback.splitlines() if line.strip()]
    return HopperTaskError(lines[-1] if lines else last.exception_class_path)


def _outside_event_loop(fn: Callable[..., None], *args: Any) -> None:
    """Call ``fn`` from sync code: here, unless this thread runs an event loop.

    Signal receivers are sync code that may use the ORM, which refuses to
    run in an event loop's thread. Called there (an ``async def`` task's
    attempt ending on the worker's loop), ``fn`` runs in a thread of its own
    while this one waits, as long as the receivers would have taken here.
    """
    if not _on_event_loop():
        fn(*args)  # not inside the except: a receiver must not see that RuntimeError
        return
    context = contextvars.copy_context()
    _sync_executor().submit(context.run, _with_fresh_connections, fn, *args).result()


def _on_event_loop() -> bool:
    """Return whether this thread is running an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _with_fresh_connections(fn: Callable[..., None], *args: Any) -> None:
    """Call ``fn`` with Django's per-request connection upkeep around it."""
    close_old_connections()
    try:
        fn(*args)
    finally:
        close_old_connections()


_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _sync_executor() -> concurrent.futures.ThreadPoolExecutor:
    """Return the one thread that runs signal receivers for code on an event loop."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="hopper-task-signals"
            )
        return _executor


def announce_finished(rows: Iterable[JobRow]) -> int:
    """Send ``task_finished`` for the Django tasks among ``rows`` that hopper ended itself.

    The worker announces the endings of its attempts (``_on_job_finished``);
    the leader's services end tasks outside any attempt: the rescue of a
    dead or stuck worker's attempt, and the expiry of a TTL or a job lease.
    They call this with the jobs as ended (``canceled`` or ``discarded``,
    their errors recorded), in the process that ended them: receivers
    connected in that process (the leader's) see the signal, not those of
    the worker that had run the task. A receiver's error is logged, never
    raised, so that it cannot stop a maintenance pass. Returns how many
    signals were sent.
    """
    sent = 0
    for row in rows:
        spec = task_spec(row)
        if spec is None or row.state not in ("completed", "canceled", "discarded"):
            continue
        backend = hopper_backend(str(spec.get("backend")))
        if backend is None:
            continue
        result = backend.result_from_row(row)
        try:
            send_finished(type(backend), result)
        except Exception:
            logger.exception("a task_finished receiver failed for task %s", result.id)
        sent += 1
    return sent


def _on_jobs_ended(sender: Any, jobs: Sequence[JobRow], **kwargs: Any) -> None:
    """Announce the tasks among jobs hopper ended outside an attempt (``jobs_ended``)."""
    announce_finished(jobs)


job_finished.connect(_on_job_finished, dispatch_uid="django_hopper.tasks.signal_handlers")
jobs_ended.connect(_on_jobs_ended, dispatch_uid="django_hopper.tasks.signal_handlers.ended")
