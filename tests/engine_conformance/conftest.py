"""Fixtures of the engine conformance suite (run once per engine)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from tests.engine_conformance.support import register


@pytest.fixture
def client_id(engine: BaseEngine, db_now: dt.datetime) -> int:
    """A client registered at ``db_now`` with an hour-long lease."""
    return register(engine, db_now)


@pytest.fixture
def other_client_id(engine: BaseEngine, db_now: dt.datetime) -> int:
    """A second live client."""
    return register(engine, db_now)
