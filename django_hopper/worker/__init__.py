"""The worker runtime: one process is one client (see :mod:`django_hopper.worker.worker`).

Names are imported lazily so that :mod:`django_hopper.maintenance`, which the
worker embeds, can use the runtime's helpers without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_hopper.worker.worker import Worker, WorkerConfig, import_job_modules

__all__ = ["Worker", "WorkerConfig", "import_job_modules"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from django_hopper.worker import worker  # noqa: PLC0415 - import cycle: worker.worker imports maintenance, which imports this package

        return getattr(worker, name)
    raise AttributeError(f"module 'django_hopper.worker' has no attribute {name!r}")
