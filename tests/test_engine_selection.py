"""Engine selection by the connection's vendor."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_hopper import engine as engine_module
from django_hopper.engine import get_engine, reset_engines


class FakeConnections:
    """Stands in for ``django.db.connections``: every alias is a MySQL connection."""

    class Connection:
        vendor = "mysql"

    def __getitem__(self, alias: str) -> Any:
        return self.Connection()


def test_an_unsupported_database_vendor_raises_improperly_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "connections", FakeConnections())
    monkeypatch.setattr(engine_module, "_engines", {})
    with pytest.raises(ImproperlyConfigured, match=r"supports PostgreSQL and SQLite.*'mysql'"):
        get_engine("legacy")


def test_an_unknown_alias_raises_improperly_configured() -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown database alias 'nope'"):
        get_engine("nope")
    reset_engines()
