"""Queues placed on several databases: a busy queue on a PostgreSQL of its own,
or an SQLite file beside PostgreSQL (``HOPPER["QUEUE_DATABASES"]``).

Enqueue writes each job through its queue's alias and joins that alias's
transaction; a worker process serves the queues of one alias (``--database``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import override_settings

import django_hopper
from django_hopper.engine import get_engine
from tests.support.runtime import Processes, wait_for
from tests.testapp import jobs
from tests.topology.conftest import POSTGRES

#: The second alias of each pass: another PostgreSQL database, and SQLite beside
#: it; on the SQLite pass, another SQLite file.
SECOND = ["second", "embedded"] if POSTGRES else ["second"]
ALL = ["default", *SECOND]

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=ALL),
    pytest.mark.skipif(
        bool(os.environ.get("HOPPER_TEST_PGBOUNCER_PORT")),
        reason="several databases run in the direct passes",
    ),
]


def placed(alias: str) -> Any:
    """The test settings with the queue "busy" placed on ``alias``."""
    from django.conf import settings

    return override_settings(
        HOPPER={
            **settings.HOPPER,
            "QUEUES": {"default": 2, "busy": 2},
            "QUEUE_DATABASES": {"busy": alias},
        }
    )


def on(alias: str, job_id: Any) -> bool:
    return get_engine(alias).job_get(job_id) is not None


@pytest.mark.parametrize("alias", SECOND)
def test_enqueue__a_placed_queue_is_written_on_its_alias(alias: str):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)
        plain = jobs.add.enqueue(3, 4)

        assert on(alias, busy.id) and not on("default", busy.id)
        assert on("default", plain.id) and not on(alias, plain.id)
        assert busy.refresh().queue == "busy"  # the handle reads its own alias


@pytest.mark.parametrize("alias", SECOND)
def test_enqueue__joins_the_transaction_of_its_queues_alias(alias: str):
    with placed(alias):
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            rolled_back = jobs.add.using(queue="busy").enqueue(1, 2)
            raise RuntimeError("roll back")
        with pytest.raises(RuntimeError), transaction.atomic(using="default"):
            kept = jobs.add.using(queue="busy").enqueue(1, 2)
            raise RuntimeError("another database's transaction")

        assert not on(alias, rolled_back.id)
        assert on(alias, kept.id)


@pytest.mark.parametrize("alias", SECOND)
def test_enqueue_many__each_job_lands_on_its_queues_alias_in_input_order(alias: str):
    with placed(alias):
        handles = django_hopper.enqueue_many(
            [
                jobs.add.using(queue="busy").prepare(1, 1),
                jobs.add.prepare(2, 2),
                jobs.add.using(queue="busy").prepare(3, 3),
            ]
        )

        assert [h.job.args["args"] for h in handles] == [[1, 1], [2, 2], [3, 3]]
        assert [on(alias, h.id) for h in handles] == [True, False, True]


def test_hopper_worker__refuses_a_queue_that_lives_on_another_database():
    with placed("second"), pytest.raises(CommandError, match="--database second"):
        call_command("hopper_worker", "--queues", "busy:2", "--burst")


def test_hopper_worker__serves_by_default_the_queues_of_its_database():
    from django_hopper.management.commands.hopper_worker import _queues_on

    with placed("second"):
        assert _queues_on("second", {"default": 2, "busy": 2}, explicit=False) == {"busy": 2}
        assert _queues_on("default", {"default": 2, "busy": 2}, explicit=False) == {"default": 2}


class PlacedProcesses(Processes):
    """Worker processes that know every test database's name."""

    def env(self, overrides: dict[str, Any] | None = None) -> dict[str, str]:
        env = super().env(overrides)
        for alias in SECOND:
            env[f"HOPPER_TEST_{alias.upper()}_DB_NAME"] = str(
                connections[alias].settings_dict["NAME"]
            )
        return env


@pytest.mark.processes
@pytest.mark.parametrize("alias", SECOND)
def test_workers__one_per_database_run_the_queues_of_each(alias: str, tmp_path: Path):
    procs = PlacedProcesses(str(connections["default"].settings_dict["NAME"]), tmp_path)
    overrides = {"QUEUES": {"default": 2, "busy": 2}, "QUEUE_DATABASES": {"busy": alias}}
    try:
        with placed(alias):
            procs.start("--database", alias, overrides=overrides)
            procs.start(overrides=overrides)  # HOPPER["DATABASE"]: the queue "default"
            busy = [jobs.add.using(queue="busy").enqueue(i, 1) for i in range(5)]
            plain = [jobs.add.enqueue(i, 2) for i in range(5)]

            for handle in busy + plain:
                wait_for(lambda h=handle: h.refresh().state == "completed", timeout=90)
            assert [h.refresh().output for h in busy] == [i + 1 for i in range(5)]
            assert [h.refresh().output for h in plain] == [i + 2 for i in range(5)]
            assert all(p.poll() is None for p in procs.procs), procs.logs()
    finally:
        procs.kill_all()
