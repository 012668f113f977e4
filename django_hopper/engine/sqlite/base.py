"""The SQLite engine: sqlite3 through Django's connection, one writer at a time."""

from __future__ import annotations

from django_hopper.engine.base import BaseEngine, EngineFeatures


class SQLiteEngine(BaseEngine):
    vendor = "sqlite"
    features = EngineFeatures(single_writer=True)
