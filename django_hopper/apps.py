from __future__ import annotations

from django.apps import AppConfig


class HopperConfig(AppConfig):
    name = "django_hopper"
    label = "django_hopper"
    verbose_name = "Hopper job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_hopper import checks, observability, periodic, topology  # noqa: F401

        observability.setup()  # tracing and metrics, when their packages are installed

        self._connect_tasks_backend()

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
        from django.conf import settings

        from django_hopper import registry, tasks_compat

        registry.register_resolver(tasks_compat.job_function_for)
        tasks = getattr(settings, "TASKS", None) or {}
        if not isinstance(tasks, dict):
            return
        if any(
            isinstance(cfg, dict) and str(cfg.get("BACKEND", "")).startswith("django_hopper.")
            for cfg in tasks.values()
        ):
            import django_hopper.tasks  # noqa: F401
