"""The PostgreSQL engine: psycopg 3 through Django's connection."""

from __future__ import annotations

from django_hopper.engine.base import BaseEngine, EngineFeatures


class PostgresEngine(BaseEngine):
    vendor = "postgresql"
    features = EngineFeatures(
        supports_copy=True,
        supports_listen=True,
        single_writer=False,
        supports_history_partitions=True,
        supports_skip_locked=True,
        supports_json_indexes=True,
    )
