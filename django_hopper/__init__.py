"""django_hopper: a durable, transactional job queue on the database you already run.

The public API is imported lazily so that importing ``django_hopper`` (as
``INSTALLED_APPS`` does) touches neither models nor settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

_LAZY = {
    # name -> module; the enqueue API
    "job": "django_hopper.jobs",
    "JobFunction": "django_hopper.jobs",
    "JobHandle": "django_hopper.jobs",
    "resolve": "django_hopper.jobs",
    # operator functions
    "get_job": "django_hopper.api",
    "cancel_job": "django_hopper.api",
    "retry_job": "django_hopper.api",
    "delete_job": "django_hopper.api",
    "list_jobs": "django_hopper.api",
    "job_logs": "django_hopper.api",
}

# Spelled out (not derived from _LAZY) so that linters and type checkers read it.
__all__ = [
    "JobFunction",
    "JobHandle",
    "__version__",
    "cancel_job",
    "delete_job",
    "get_job",
    "job",
    "job_logs",
    "list_jobs",
    "resolve",
    "retry_job",
]

if TYPE_CHECKING:  # let type checkers and IDEs see the lazy names
    from django_hopper.api import (
        cancel_job,
        delete_job,
        get_job,
        job_logs,
        list_jobs,
        retry_job,
    )
    from django_hopper.jobs import JobFunction, JobHandle, job, resolve


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_hopper' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
