"""How a task's failures read through the Tasks API: ``TaskError`` from hopper's records.

A worker stores each failed attempt's error line and formatted traceback;
hopper itself records the attempts it ends (a timeout, the rescue of a dead
worker, an expired TTL, a cancel). This module turns each record into the
``TaskError`` a ``TaskResult`` lists, naming the exception's class as the
traceback printed it.
"""

from __future__ import annotations

import builtins
import re
from typing import TYPE_CHECKING

from django_hopper.exceptions import HopperError
from django_hopper.registry import UNKNOWN_KIND_PREFIX
from django_hopper.tasks_compat import Task, TaskError

if TYPE_CHECKING:
    from django_hopper.types import AttemptError, JobRow


class HopperTaskError(HopperError):
    """Stands in a TaskError for an attempt that hopper ended, not the task's code.

    A timeout, a worker that died (rescue), an expired TTL: ``TaskError`` needs
    an exception class, and these have none of the task's; the traceback text
    carries hopper's reason.
    """


_EXC_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?::\s|:$|$)")
_TRACE_HEADER = "Traceback (most recent call last):"
_GROUP_HEADER = "  + Exception Group Traceback (most recent call last):"
_GROUP_MARGIN = "  | "
_RESCUE_EXCEPTIONS = {"canceled": "django_hopper.exceptions.JobCanceled"}


def task_error(err: AttemptError) -> TaskError:
    """Return the TaskError of one recorded failure.

    The worker stores the formatted traceback, whose exception line names the
    class as Python prints it (``module.Class``, bare for builtins); failures
    hopper recorded itself (cancel, rescue, timeout) map to hopper exceptions.
    """
    hopper_path = f"{HopperTaskError.__module__}.{HopperTaskError.__qualname__}"
    if err.rescue:
        path = _RESCUE_EXCEPTIONS.get(err.rescue, hopper_path)
        return TaskError(exception_class_path=path, traceback=err.trace or f"{err.error}\n")
    found = _exception_path(err.trace) if err.trace else _exception_path(err.error)
    return TaskError(
        exception_class_path=found or hopper_path, traceback=err.trace or f"{err.error}\n"
    )


def task_errors(row: JobRow, task: Task) -> list[TaskError]:
    """Return the TaskErrors of a job's recorded failures.

    A stand-in for a task that can no longer be imported reports the failure
    its worker recorded for it (the kind resolved to nothing) as the
    ImportError that caused it.
    """
    errors = [task_error(e) for e in row.errors]
    problem = getattr(task.func, "hopper_import_error", None)
    if problem is not None and row.errors and is_unknown_kind_error(row.errors[-1]):
        cls = type(problem)
        errors[-1] = TaskError(
            exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
            traceback=f"{row.errors[-1].error}\n{cls.__name__}: {problem}\n",
        )
    return errors


def is_unknown_kind_error(err: AttemptError) -> bool:
    """Return whether a recorded failure is the worker's "no function for this kind"."""
    return not err.trace and not err.rescue and err.error.startswith(UNKNOWN_KIND_PREFIX)


def _exception_path(text: str) -> str | None:
    """Return the import path of the final exception in a formatted traceback, or None.

    The final exception is the one after the last top-level header: a plain
    ``Traceback`` header, or an exception group's, whose own lines (frames,
    then the group's exception line, then its sub-exceptions) are drawn
    behind a ``  | `` margin.
    """
    if not text:
        return None
    lines = text.splitlines()
    start, group = 0, bool(lines) and lines[0].startswith(_GROUP_MARGIN)
    for i, line in enumerate(lines):
        if line in (_TRACE_HEADER, _GROUP_HEADER):
            start, group = i + 1, line == _GROUP_HEADER
    for line in lines[start:]:
        if group:
            if not line.startswith(_GROUP_MARGIN):
                return None  # the group's sub-exceptions start: its own line was not found
            line = line[len(_GROUP_MARGIN) :]
        if not line or line[0].isspace():
            continue
        match = _EXC_LINE.match(line)
        if match is None:
            return None
        name = match.group("name")
        if "." in name:
            return name
        return f"builtins.{name}" if hasattr(builtins, name) else f"__main__.{name}"
    return None
