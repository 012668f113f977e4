"""Shared fixtures. The whole suite runs once per engine (``HOPPER_TEST_DATABASE``)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine import get_engine
from django_hopper.engine.base import BaseEngine

#: The subset of the suite that also runs through PgBouncer (``-m pgbouncer``,
#: scripts/test's bouncer pass): claim, finalize, limits, leader, notifications,
#: transactional enqueue, the worker loop and the Tasks backend.
PGBOUNCER_SUBSET = (
    "tests/engine_conformance/test_claim.py",
    "tests/engine_conformance/test_finalize.py",
    "tests/engine_conformance/test_limits.py",
    "tests/engine_conformance/test_clients.py",
    # The migration lock needs a session: through the direct connection.
    "tests/engine_conformance/test_schema.py",
    "tests/runtime/test_notifications.py",
    "tests/runtime/test_transactional_enqueue.py",
    "tests/runtime/test_lifecycle.py",
    "tests/tasks_backend/test_backend.py",
    # tests/topology's own bouncers and its migrations test reach the server directly.
    "tests/topology/test_failover.py",
    "tests/topology/test_settings.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the PgBouncer subset."""
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix()
        if where.startswith(PGBOUNCER_SUBSET):
            item.add_marker(pytest.mark.pgbouncer)


@pytest.fixture
def engine(db: None) -> BaseEngine:
    """The engine of the test database, inside the test's transaction."""
    return get_engine()


@pytest.fixture
def tx_engine(transactional_db: None) -> BaseEngine:
    """The engine, with committed writes (for threads and worker processes)."""
    return get_engine()


@pytest.fixture
def db_now(engine: BaseEngine) -> dt.datetime:
    """The database clock at the start of the test, for injecting times."""
    return engine.now()


@pytest.fixture(scope="session", autouse=True)
def _direct_follows_default(request: pytest.FixtureRequest) -> None:
    """Point the "direct" alias (the bouncer pass's PgBouncer bypass) at the test database.

    pytest-django renames only the databases the tests ask for; "direct" is
    the same database as "default", reached without the bouncer, and every
    test may use it (a worker's leader maintains through it).
    """
    from django.db import connections
    from django.test import TransactionTestCase

    if "direct" in connections.settings:
        request.getfixturevalue("django_db_setup")
        connections["direct"].settings_dict["NAME"] = connections["default"].settings_dict["NAME"]
        TransactionTestCase.databases = {"default", "direct"}
