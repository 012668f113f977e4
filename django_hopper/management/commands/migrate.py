"""``manage.py migrate`` under hopper's migration lock.

Django's ``migrate`` reads which migrations are applied, then applies the
rest. Two deploy hosts running it at once both find the same migrations
missing: the second fails halfway through applying what the first already
did, or, for a migration that is not atomic (hopper's concurrent index
builds), runs it twice. This command is Django's, with the database's
migration lock held around the whole run (``BaseEngine.schema_lock``: an
advisory lock on PostgreSQL, a lock file beside the database on SQLite), so
the second waits, then finds nothing left to do. ``--plan`` and ``--check``
only read, and take no lock.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import connections

from django_hopper.engine import ENGINES
from django_hopper.schema import migration_lock


class Command(DjangoMigrate):
    help = DjangoMigrate.help + " Holds hopper's migration lock of the database while it runs."

    def handle(self, *args: Any, **options: Any) -> None:
        """Run Django's migrate, holding the migration lock unless it only reads."""
        alias = options["database"]
        if (
            options.get("plan")
            or options.get("check_unapplied")
            or connections[alias].vendor not in ENGINES
        ):
            super().handle(*args, **options)
            return

        def waiting(holder: str) -> None:
            self.stdout.write(
                f"Waiting for the migration lock of database {alias!r}, held by {holder}."
            )
            self.stdout.flush()

        with migration_lock(alias, on_wait=waiting):
            super().handle(*args, **options)
