"""The Django Tasks backend under its earlier name: :mod:`django_hopper.tasks` is canonical.

``TASKS = {"default": {"BACKEND": "django_hopper.tasks_backend.HopperBackend"}}``
keeps working; new settings name ``django_hopper.tasks.backend.HopperBackend``.
Every name this module exported before is re-exported from the package.
"""

from __future__ import annotations

from django_hopper.tasks import (
    DEFAULT_MAX_ATTEMPTS,
    HOPPER_FIELDS,
    META_KEY,
    OPTION_KEYS,
    HopperBackend,
    HopperTask,
    HopperTaskError,
    announce_finished,
    hopper_options,
    job_context,
    job_function_for_task,
    send_finished,
    task_error,
)

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
    "task_error",
]
