"""Set up Django for a PostgreSQL-only bench tool, written once for all of them."""

from __future__ import annotations

import os
import sys


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
    call_command("migrate", verbosity=0, interactive=False)
    return True
