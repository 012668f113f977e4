"""Shared fixtures. The whole suite runs once per engine (``HOPPER_TEST_DATABASE``)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine import get_engine
from django_hopper.engine.base import BaseEngine


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
