"""Engine selection: one engine per Django database alias, chosen by the
connection's vendor (as Django chooses a backend)."""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from django_hopper.conf import hopper_settings
from django_hopper.engine.base import BaseEngine

#: Vendor -> engine class path. The only vendor mapping in hopper.
ENGINES = {
    "postgresql": "django_hopper.engine.postgres.base.PostgresEngine",
    "sqlite": "django_hopper.engine.sqlite.base.SQLiteEngine",
}

_engines: dict[str, BaseEngine] = {}
_lock = threading.Lock()


def get_engine(alias: str | None = None) -> BaseEngine:
    """Return the engine of a database alias (default: ``HOPPER["DATABASE"]``)."""
    if alias is None:
        alias = hopper_settings.DATABASE
    engine = _engines.get(alias)
    if engine is not None:
        return engine
    with _lock:
        engine = _engines.get(alias)
        if engine is None:
            try:
                vendor = connections[alias].vendor
            except Exception as exc:
                raise ImproperlyConfigured(f"hopper: unknown database alias {alias!r}") from exc
            path = ENGINES.get(vendor)
            if path is None:
                raise ImproperlyConfigured(
                    f"hopper supports PostgreSQL and SQLite; database {alias!r} is {vendor!r}"
                )
            engine = import_string(path)(alias)
            _engines[alias] = engine
    return engine


def reset_engines() -> None:
    """Forget cached engines (tests that swap databases)."""
    with _lock:
        _engines.clear()
