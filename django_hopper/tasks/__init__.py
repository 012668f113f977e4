"""Django's Tasks API on hopper: ``@task`` code runs under ``hopper_worker`` unchanged.

Configure it like any task backend (Django 6's ``django.tasks`` or the
``django_tasks`` backport on Django 5.2; see :mod:`django_hopper.tasks_compat`)::

    TASKS = {
        "default": {
            "BACKEND": "django_hopper.tasks.backend.HopperBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"max_attempts": 3},
        }
    }

The package mirrors ``django/tasks/``: :mod:`~django_hopper.tasks.backend`
(the backend and its task class: storing and reading tasks),
:mod:`~django_hopper.tasks.runner` (running a task in hopper's worker),
:mod:`~django_hopper.tasks.signal_handlers` (hopper's signals translated into
``task_finished``) and :mod:`~django_hopper.tasks.errors` (``TaskError`` from
hopper's records). ``django_hopper.tasks_backend`` is the same API under the
name earlier releases documented.

Documentation: ``docs/django-tasks.md``.
"""

from __future__ import annotations

from django_hopper.tasks import signal_handlers
from django_hopper.tasks.backend import (
    DEFAULT_MAX_ATTEMPTS,
    HOPPER_FIELDS,
    META_KEY,
    OPTION_KEYS,
    HopperBackend,
    HopperTask,
    hopper_options,
)
from django_hopper.tasks.errors import HopperTaskError, task_error
from django_hopper.tasks.runner import job_context, job_function_for_task
from django_hopper.tasks.signal_handlers import announce_finished, send_finished

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "HOPPER_FIELDS",
    "META_KEY",
    "OPTION_KEYS",
    "HopperBackend",
    "HopperTask",
    "HopperTaskError",
    "announce_finished",
    "hopper_options",
    "job_context",
    "job_function_for_task",
    "send_finished",
    "signal_handlers",
    "task_error",
]
