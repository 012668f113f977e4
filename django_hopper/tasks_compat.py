"""One name for Django's Tasks API, wherever it lives.

Django 6 ships it as ``django.tasks``; Django 5.2 projects get the same API
from the ``django-tasks`` backport (``django_tasks``). The two mirror each
other but differ in a few spellings (``InvalidTask`` is ``InvalidTaskError``
in the backport, ``normalize_json`` lives in ``django.utils.json`` or
``django_tasks.utils``). Hopper's backend imports everything from here, so it
is written once for both.

``django.tasks`` wins when both exist: it is the namespace Django's own
``TASKS`` setting handler reads. When neither is installed this module still
imports, with ``AVAILABLE`` False and none of the API names, so that
:func:`job_function_for` (a resolver the worker asks for module attributes
that are not ``@job`` functions) works in projects without the Tasks API;
importing a missing name raises ImportError as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_hopper.jobs import JobFunction

#: Which namespace provides the Tasks API: "django.tasks", "django_tasks" or "".
NAMESPACE = ""

try:
    from django.tasks import (  # type: ignore[import-not-found,unused-ignore]
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        task,
        task_backends,
    )
    from django.tasks.backends.base import (  # type: ignore[import-not-found,unused-ignore]
        BaseTaskBackend,
    )
    from django.tasks.base import (  # type: ignore[import-not-found,unused-ignore]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import (  # type: ignore[import-not-found,unused-ignore]
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import (  # type: ignore[import-not-found,unused-ignore]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django.utils.json import (  # type: ignore[attr-defined,unused-ignore]
        normalize_json as _normalize_json,
    )

    NAMESPACE = "django.tasks"
except ImportError:
    try:
        from django_tasks import (  # type: ignore[no-redef,unused-ignore]
            DEFAULT_TASK_BACKEND_ALIAS,
            DEFAULT_TASK_QUEUE_NAME,
            task,
            task_backends,
        )
        from django_tasks.backends.base import (  # type: ignore[no-redef,unused-ignore]
            BaseTaskBackend,
        )
        from django_tasks.base import (  # type: ignore[no-redef,unused-ignore]
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,unused-ignore]
            InvalidTaskBackendError as InvalidTaskBackend,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,unused-ignore]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,unused-ignore]
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )
        from django_tasks.signals import (  # type: ignore[no-redef,unused-ignore]
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import (  # type: ignore[no-redef,unused-ignore]
            normalize_json as _normalize_json,
        )

        NAMESPACE = "django_tasks"
    except ImportError:
        pass

#: True when one of the two namespaces is installed.
AVAILABLE = bool(NAMESPACE)


def normalize_json(value: Any) -> Any:
    """Normalize a value to JSON types exactly as Django's TaskResult does.

    Raises TypeError ("Unsupported type") for anything else, which is the
    error Django's own backends report for arguments and return values.
    """
    return _normalize_json(value)


def job_function_for(obj: object) -> JobFunction[Any, Any] | None:
    """Return the job function that runs a Django Task, or None for anything else.

    The resolver the app registers with :mod:`django_hopper.registry` (in
    ``ready``): the worker resolves a kind to a module attribute, and for a
    ``@task`` function that attribute is a ``Task``, not a ``JobFunction``.
    Projects without the Tasks API pay one boolean test per resolve.
    """
    if not AVAILABLE or not isinstance(obj, Task):
        return None
    # Imported here: the runner needs the whole backend, which a project that
    # never runs a task through hopper never loads.
    from django_hopper.tasks.runner import job_function_for_task  # noqa: PLC0415 - import cycle: tasks.runner imports tasks_compat

    return job_function_for_task(obj)


__all__ = [
    "AVAILABLE",
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_QUEUE_NAME",
    "NAMESPACE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "job_function_for",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
