"""Set up Django for a PostgreSQL-only bench tool, written once for all of them."""

from __future__ import annotations

import os
import sys
from typing import Any


def setup_postgres(tool: str) -> bool:
    """Set Django up on the benchmark settings and migrate; return whether it is PostgreSQL.

    ``BENCH_ENGINE`` defaults to ``postgres``; on another database the tool
    says it is PostgreSQL only (its exit status is then 2).
    """
    os.environ.setdefault("BENCH_ENGINE", "postgres")
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        print(f"{tool}: PostgreSQL only", file=sys.stderr)
        return False
    _create_database(connection.settings_dict)
    call_command("migrate", verbosity=0, interactive=False)
    return True


def maintenance_connection(db: dict[str, Any]) -> Any:
    """Open an autocommit psycopg connection to the ``postgres`` database of the
    server ``db`` (a Django ``DATABASES`` entry) names, to create or drop
    ``db``'s own database from outside it."""
    import psycopg

    return psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"],
        dbname="postgres",
        autocommit=True,
    )


def _create_database(db: dict[str, Any]) -> None:
    """Create the benchmark's database if it does not exist yet (``scripts/bench``
    creates it for its runs; a tool run first on a fresh ``BENCH_PG_DB`` would
    otherwise fail to connect). An existing one is kept as it is."""
    from psycopg import sql

    with maintenance_connection(db) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if found.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
