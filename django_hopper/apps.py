from __future__ import annotations

from django.apps import AppConfig


class HopperConfig(AppConfig):
    name = "django_hopper"
    label = "django_hopper"
    verbose_name = "Hopper job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_hopper import checks, periodic  # noqa: F401  (register the system checks)
