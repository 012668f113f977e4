from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig
from django.conf import settings

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine


class HopperConfig(AppConfig):
    name = "django_hopper"
    label = "django_hopper"
    verbose_name = "Hopper job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_hopper import checks, observability, periodic, topology  # noqa: F401, PLC0415 - registers checks and signal handlers once the app registry is ready

        observability.setup()  # tracing and metrics, when their packages are installed

        self._connect_tasks_backend()
        self._declare_at_worker_setup()

    def _declare_at_worker_setup(self) -> None:
        """Have every worker upsert the subscriptions and stream consumers the code declares.

        The runtime sits below the API modules and never imports them; this
        is the hook through which it syncs what they declare.
        """
        from django_hopper.worker.declarations import SETUP_DECLARATIONS  # noqa: PLC0415 - needs the app registry

        if _sync_declared not in SETUP_DECLARATIONS:
            SETUP_DECLARATIONS.append(_sync_declared)

    def _connect_tasks_backend(self) -> None:
        """Let the worker run ``@task`` functions, and the Tasks backend hear hopper's signals.

        ``registry.resolve`` asks ``tasks_compat.job_function_for`` for module
        attributes that are not ``@job`` functions (a boolean test when the
        Tasks API is not installed). The leader's services and ``cancel_job``
        announce the tasks they end through ``jobs_ended``, so the backend
        must be listening in every process that can end one, not only where a
        task was enqueued or run: importing :mod:`django_hopper.tasks`
        connects its receivers, when a ``TASKS`` entry uses it. The lower
        layers never import it themselves (imports point down).
        """

        from django_hopper import registry, tasks_compat  # noqa: PLC0415 - needs the app registry

        registry.register_resolver(tasks_compat.job_function_for)
        tasks = getattr(settings, "TASKS", None) or {}
        if not isinstance(tasks, dict):
            return
        if any(
            isinstance(cfg, dict) and str(cfg.get("BACKEND", "")).startswith("django_hopper.")
            for cfg in tasks.values()
        ):
            import django_hopper.tasks  # noqa: F401, PLC0415 - loaded only when a TASKS backend is this package


def _sync_declared(engine: BaseEngine) -> object:
    """Upsert the subscriptions and stream consumers the code declares (a worker's setup)."""
    # Imported when a worker sets up, not in every process's start-up.
    from django_hopper.streams import sync_declared  # noqa: PLC0415 - needs the app registry

    return sync_declared(engine)
