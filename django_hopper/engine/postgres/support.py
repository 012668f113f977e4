"""What every part of the PostgreSQL engine shares: its named SQL, the way a
query runs on Django's connection, and the translation of driver errors.

Queries run on the Django connection of the engine's alias, so a call made
inside ``transaction.atomic()`` is part of the caller's transaction (the
transactional-enqueue promise). Driver errors never leave the engine: they
become :mod:`django_hopper.exceptions`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import Error as DjangoDatabaseError
from django.db import transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.queries import load
from django_hopper.exceptions import (
    DatabaseError,
    HopperError,
    InvalidJob,
    JobLocked,
    UniqueConflict,
)

#: Every named query of the engine (``queries/*.sql``).
QUERIES: dict[str, str] = load(os.path.dirname(__file__))

#: SQLSTATEs hopper attributes to a cause of its own.
LOCK_NOT_AVAILABLE = "55P03"
UNIQUE_VIOLATION = "23505"
CHECK_VIOLATION = "23514"
NOT_NULL_VIOLATION = "23502"


def _sqlstate(exc: BaseException) -> str | None:
    """Return the SQLSTATE of a psycopg error, or of the one a Django error wraps."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, psycopg.Error):
            return candidate.sqlstate
    return None


def translate(exc: BaseException) -> HopperError:
    """Map a driver error to the hopper exception that names its cause."""
    state = _sqlstate(exc)
    detail = str(exc.__cause__ or exc).strip()
    if state == LOCK_NOT_AVAILABLE:
        return JobLocked(f"another transaction holds the job's row: {detail}")
    if state == UNIQUE_VIOLATION:
        return UniqueConflict(f"a live job holds the same kind and unique key: {detail}")
    if state in (CHECK_VIOLATION, NOT_NULL_VIOLATION):
        return InvalidJob(f"the database refused the job: {detail}")
    return DatabaseError(detail or type(exc).__name__)


@contextmanager
def db_errors() -> Iterator[None]:
    """Translate driver errors raised in the block into hopper exceptions."""
    try:
        yield
    except HopperError:
        raise
    except (DjangoDatabaseError, psycopg.Error) as exc:
        raise translate(exc) from exc


class PostgresSupport(BaseEngine):
    """Query helpers the engine's mixins share."""

    def _atomic(self) -> transaction.Atomic:
        """Return an atomic block that joins the caller's transaction if there is one.

        No savepoint: a method's statements simply become part of whatever
        transaction is running, and commit with it.
        """
        return transaction.atomic(using=self.alias, savepoint=False)

    def _fetchall(
        self, name: str, params: Mapping[str, Any], sql: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run a named query and return its rows."""
        with db_errors(), self.connection.cursor() as cursor:
            cursor.execute(sql or QUERIES[name], params)
            if cursor.description is None:
                return []
            return cursor.fetchall()  # type: ignore[no-any-return]

    def _fetchone(
        self, name: str, params: Mapping[str, Any], sql: str | None = None
    ) -> tuple[Any, ...] | None:
        """Run a named query and return its first row, or None."""
        with db_errors(), self.connection.cursor() as cursor:
            cursor.execute(sql or QUERIES[name], params)
            return cursor.fetchone()  # type: ignore[no-any-return]

    def _execute(self, name: str, params: Mapping[str, Any]) -> int:
        """Run a named statement and return how many rows it changed."""
        with db_errors(), self.connection.cursor() as cursor:
            cursor.execute(QUERIES[name], params)
            return int(cursor.rowcount)
