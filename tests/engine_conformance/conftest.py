"""Fixtures of the engine conformance suite (run once per engine)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from tests.engine_conformance.support import register

#: Long enough for every injected clock of the suite: a claim needs a live lease.
LONG_LEASE = dt.timedelta(days=3650)


@pytest.fixture
def client_id(engine: BaseEngine, db_now: dt.datetime) -> int:
    """A client registered at ``db_now`` whose lease outlives every test's clock."""
    return register(engine, db_now, LONG_LEASE)


@pytest.fixture
def other_client_id(engine: BaseEngine, db_now: dt.datetime) -> int:
    """A second live client."""
    return register(engine, db_now, LONG_LEASE)
