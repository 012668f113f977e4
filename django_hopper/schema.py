"""Which hopper schema this code is built for, and whether a database's goes with it.

The schema's version is the number of the newest applied hopper migration
(``django_migrations``); the code's is the number of the newest migration it
ships. A worker checks the two at start (one query, no lock) and refuses to
run, naming both and the command to run, when:

* the database is behind the code: migrations this code needs are not applied
  (``manage.py migrate django_hopper``);
* the database is past what the code supports: an applied migration declared,
  with ``migration_operations.RequireCode``, that code built for older schemas
  must not run any more (deploy newer code).

A database a few migrations ahead of the code is served: hopper's migrations
only add to the schema unless one declares otherwise, so the workers of the
previous release keep running during a rolling deploy that migrated first.

``migration_lock`` is the cross-process lock ``manage.py migrate`` holds
(docs/deploying.md, "Migrating").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django_hopper.engine import get_engine
from django_hopper.engine.params import SchemaLockParams, SchemaState
from django_hopper.engine.rules import code_version

__all__ = ["check", "code_version", "migration_lock"]


def check(alias: str) -> SchemaState:
    """Check the schema of database ``alias`` against this code; return it.

    One read of ``django_migrations`` (and the floor table), taking no lock,
    so a worker starting during a migration is not held up by it. Raises
    :class:`~django_hopper.exceptions.SchemaMismatch` naming both versions.
    """
    return get_engine(alias).schema_check()


@contextmanager
def migration_lock(alias: str, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the migration lock of database ``alias`` for the block.

    ``manage.py migrate`` takes it (hopper ships that command); a deploy
    script that migrates another way takes it with this.
    """
    with get_engine(alias).schema_lock(SchemaLockParams(on_wait=on_wait)):
        yield
