"""The schema: migrations match the models, and the history table matches the live one."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from django_hopper.models import Job, JobHistory


@pytest.mark.django_db
def test_makemigrations__finds_nothing_to_do() -> None:
    out = io.StringIO()
    # --check exits non-zero (SystemExit) when a model change lacks a migration.
    call_command("makemigrations", "django_hopper", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_history_table__has_every_live_column_plus_outcome_columns() -> None:
    with connection.cursor() as cursor:
        live = {
            c.name
            for c in connection.introspection.get_table_description(cursor, Job._meta.db_table)
        }
        history = {
            c.name
            for c in connection.introspection.get_table_description(
                cursor, JobHistory._meta.db_table
            )
        }
    assert history - live == {"finalized_at", "output"}
    assert live <= history
