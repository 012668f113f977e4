"""Fixtures for the topology tests: PgBouncers started by the suite, worker processes
pointed at them, and the database-wide operations a failover does."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pgbouncer import Bouncer, binary
from tests.support.runtime import Processes, processes  # noqa: F401  (the fixture)

POSTGRES = os.environ.get("HOPPER_TEST_DATABASE", "sqlite") == "postgres"

requires_postgres = pytest.mark.skipif(not POSTGRES, reason="a PostgreSQL topology")


@pytest.fixture(scope="module")
def bouncers() -> Iterator[dict[str, Bouncer]]:
    """Start a PgBouncer per pool mode, in front of the test server; stopped after the module.

    A missing pgbouncer fails the test (install it: apt-get install -y pgbouncer):
    the PostgreSQL half never skips its topology.
    """
    if binary() is None:
        pytest.fail("pgbouncer is not installed (apt-get install -y pgbouncer)")
    from django.conf import settings

    direct = settings.DATABASES.get("direct", settings.DATABASES["default"])
    started: dict[str, Bouncer] = {}
    for mode in ("transaction", "session"):
        bouncer = Bouncer(
            # Not under pytest's tmp (0700): the bouncer runs as "nobody" under root.
            Path(tempfile.mkdtemp(prefix=f"hopper-pgbouncer-{mode}-")),
            mode,
            server_host=str(direct["HOST"]),
            server_port=int(direct["PORT"]),
            user=str(direct["USER"]),
        )
        bouncer.start()
        started[mode] = bouncer
    yield started
    for bouncer in started.values():
        bouncer.stop()
        shutil.rmtree(bouncer.workdir, ignore_errors=True)


class BouncedProcesses(Processes):
    """Worker processes whose "default" alias goes through a PgBouncer of the test."""

    def __init__(self, db_name: str, tmp: Path, bouncer: Bouncer) -> None:
        super().__init__(db_name, tmp)
        self.bouncer = bouncer

    def env(self, overrides: dict[str, Any] | None = None) -> dict[str, str]:
        env = super().env(overrides)
        env["HOPPER_TEST_PGBOUNCER_PORT"] = str(self.bouncer.port)
        env["HOPPER_TEST_PGBOUNCER_MODE"] = self.bouncer.mode
        env["HOPPER_TEST_LOG_LEVEL"] = "INFO"  # the start line says how it reaches the database
        return env
