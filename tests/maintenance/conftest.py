"""Fixtures of the periodic and retention tests (issue 6)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import ClientRegisterParams

HOUR = dt.timedelta(hours=1)


def register_client(engine: BaseEngine, now: dt.datetime, ttl: dt.timedelta = HOUR) -> int:
    """Register a live client at ``now`` (a worker process, as the leader sees it)."""
    return engine.client_register(ClientRegisterParams(hostname="test-host", ttl=ttl, now=now))


@pytest.fixture
def client_id(engine: BaseEngine, db_now: dt.datetime) -> int:
    return register_client(engine, db_now)
