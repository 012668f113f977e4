"""What hopper's management commands read from their options the same way."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db import connections

from django_hopper import schema
from django_hopper.conf import hopper_settings
from django_hopper.exceptions import DatabaseUnavailable, SchemaMismatch


def database_alias(options: dict[str, Any]) -> str:
    """Return the alias ``--database`` names (``HOPPER["DATABASE"]`` without it).

    Refuse an alias DATABASES does not hold with a CommandError naming it,
    before anything connects.
    """
    alias = options.get("database") or str(hopper_settings.DATABASE)
    if alias not in connections.settings:
        raise CommandError(f"--database: {alias!r} is not in DATABASES")
    return alias


def check_schema(alias: str, *, wait_for_database: bool) -> None:
    """Refuse to start against a schema this code does not serve (a CommandError
    naming both versions).

    With ``wait_for_database``, a database that cannot be reached passes: a
    worker waits for its database and checks once it is back.
    """
    try:
        schema.check(alias)
    except SchemaMismatch as exc:
        raise CommandError(str(exc)) from exc
    except DatabaseUnavailable:
        if not wait_for_database:
            raise
