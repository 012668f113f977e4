"""The leader's aging service and the ``hopper_stats`` command."""

from __future__ import annotations

import datetime as dt
import io
import json

from django.core.management import call_command

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobInsertOpts, JobInsertParams
from django_hopper.maintenance.services import Ager
from django_hopper.queues import pause_queue, set_queue_limits


def _insert(engine: BaseEngine, now: dt.datetime, queue: str, n: int = 1) -> None:
    engine.job_insert_many(
        [JobInsertParams(kind="tests.aging", queue=queue) for _ in range(n)],
        JobInsertOpts(now=now),
    )


def _priorities(engine: BaseEngine, queue: str) -> list[int]:
    from django_hopper.models import Job

    return sorted(Job.objects.filter(queue=queue).values_list("priority", flat=True))


def test_ager__raises_waiting_jobs_once_per_aging_interval(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    set_queue_limits("aged", aging=60)
    _insert(engine, db_now - dt.timedelta(minutes=5), "aged", n=2)
    ager = Ager(engine)

    assert ager.run_once(now=db_now) == 2
    assert _priorities(engine, "aged") == [1, 1]
    # Within the interval nothing more happens, however often the leader runs it.
    assert ager.run_once(now=db_now + dt.timedelta(seconds=30)) == 0
    assert _priorities(engine, "aged") == [1, 1]
    # Once the interval has passed, one more level.
    assert ager.run_once(now=db_now + dt.timedelta(seconds=61)) == 2
    assert _priorities(engine, "aged") == [2, 2]


def test_ager__leaves_queues_without_aging_alone(engine: BaseEngine, db_now: dt.datetime) -> None:
    _insert(engine, db_now - dt.timedelta(hours=1), "plain")
    assert Ager(engine).run_once(now=db_now) == 0
    assert _priorities(engine, "plain") == [0]


def test_hopper_stats__prints_queue_depths_as_json(engine: BaseEngine, db_now: dt.datetime) -> None:
    _insert(engine, db_now, "statsq", n=3)
    pause_queue("statsq")
    out = io.StringIO()
    call_command("hopper_stats", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["queues"]["statsq"]["available"] == 3
    assert data["queues"]["statsq"]["paused"] is True


def test_hopper_stats__prints_a_table_with_one_row_per_queue(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    _insert(engine, db_now, "tableq", n=2)
    out = io.StringIO()
    call_command("hopper_stats", stdout=out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("tableq")]
    assert len(lines) == 1
    assert lines[0].split()[1] == "2"
