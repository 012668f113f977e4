"""Invalid indexes made for real, for the index repair tests.

A ``CREATE INDEX CONCURRENTLY`` that fails half-way (a unique index over
duplicates, an expression that divides by zero on one row) leaves its index
behind, invalid, as an interrupted build does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import DatabaseError as DjangoDatabaseError
from django.db import connection

from django_hopper.engine.base import BaseEngine
from tests.engine_conformance.support import insert

UNIQUE = "hopper_job_test_unique_kind"
DIVIDES = "hopper_job_test_divides"


def execute(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


def valid(name: str) -> bool | None:
    """Return whether the index is valid, None if there is no such index."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


def leftovers() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relname ~ '_cc(new|old)[0-9]*$'")
        return [row[0] for row in cursor.fetchall()]


def fails(statement: str) -> None:
    """Run a statement that must fail, as an interrupted build does."""
    with pytest.raises(DjangoDatabaseError):
        execute(statement)


def concurrent_builds(tx_engine: BaseEngine) -> Iterator[BaseEngine]:
    """Yield the engine if it has concurrent builds (else skip); drop the test's indexes after.

    Engines without them have their own tests: nothing to repair.
    """
    if not tx_engine.features.supports_concurrent_index_builds:
        pytest.skip("no concurrent builds: the nothing-to-repair tests cover this engine")
    yield tx_engine
    for name in (UNIQUE, DIVIDES, *leftovers()):
        execute(f'DROP INDEX IF EXISTS "{name}"')


def make_duplicates(engine: BaseEngine) -> None:
    now = engine.now()
    insert(engine, now, kind="tests.same")
    insert(engine, now, kind="tests.same")


def invalid_unique_index() -> None:
    """A concurrent unique build that fails on duplicates: it leaves its index invalid."""
    fails(f"CREATE UNIQUE INDEX CONCURRENTLY {UNIQUE} ON hopper_job (kind)")
    assert valid(UNIQUE) is False


def invalid_expression_index(engine: BaseEngine) -> None:
    """A concurrent build whose expression fails on one row (priority 0)."""
    insert(engine, engine.now(), kind="tests.zero", priority=0)
    fails(f"CREATE INDEX CONCURRENTLY {DIVIDES} ON hopper_job ((100 / priority))")
    assert valid(DIVIDES) is False
    execute("UPDATE hopper_job SET priority = 1 WHERE priority = 0")
