"""The schema check a worker runs at start, in process (the process-level tests are
in test_migrate_and_start.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import management
from django.core.management import CommandError, call_command

from django_hopper import schema
from django_hopper.checks import check_migrate_command
from django_hopper.engine.base import BaseEngine
from django_hopper.exceptions import DatabaseUnavailable, SchemaMismatch
from django_hopper.management.commands import hopper_worker
from django_hopper.models import Client, SchemaFloor
from django_hopper.schema import code_version
from django_hopper.worker import Worker, WorkerConfig


def test_worker__refuses_to_set_up_on_a_schema_that_no_longer_serves_its_code(
    tx_engine: BaseEngine,
) -> None:
    SchemaFloor.objects.create(code_version=code_version() + 1)
    worker = Worker(WorkerConfig(queues={"default": 1}, burst=True, maintenance=False), tx_engine)

    with pytest.raises(SchemaMismatch, match=f"built for schema {code_version()}"):
        worker.run(install_signals=False)

    assert not Client.objects.exists()


def test_hopper_worker__leaves_the_check_to_the_worker_while_the_database_is_down(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[bool] = []

    class FakeWorker:
        stranded = 0

        def __init__(self, config: Any, engine: Any) -> None:
            pass

        def run(self) -> int:
            ran.append(True)
            return 0

    def down(alias: str) -> None:
        raise DatabaseUnavailable("the database is starting up")

    monkeypatch.setattr(schema, "check", down)
    monkeypatch.setattr(hopper_worker, "Worker", FakeWorker)

    call_command("hopper_worker", "--queues", "default:1", "--burst")

    assert ran == [True]


def test_hopper_worker__exits_with_the_mismatch_before_starting_a_worker(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    SchemaFloor.objects.create(code_version=code_version() + 1)
    monkeypatch.setattr(hopper_worker, "Worker", None)  # never reached

    with pytest.raises(CommandError, match="deploy the newer code"):
        call_command("hopper_worker", "--queues", "default:1", "--burst")


def test_check_migrate_command__is_quiet_while_migrate_is_hoppers() -> None:
    assert check_migrate_command() == []


def test_check_migrate_command__warns_when_another_apps_migrate_shadows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(management, "get_commands", lambda: {"migrate": "tenants"})

    (warning,) = check_migrate_command()

    assert warning.id == "hopper.W301"
    assert "'tenants'" in warning.msg
