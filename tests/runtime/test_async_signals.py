"""``job_started`` and ``job_finished`` of ``async def`` jobs reach receivers in sync
context, so a receiver that uses the ORM works (as it does for sync jobs)."""

from __future__ import annotations

from collections import Counter

import pytest

from django_hopper.engine.base import BaseEngine
from tests.support.runtime import Processes, get, insert_many
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.processes

RECEIVERS = {"IMPORTS": ["tests.testapp.jobs", "tests.runtime.orm_receivers"]}


@pytest.mark.parametrize(
    ("fn", "args", "state"),
    [
        (jobs.async_add, (1, 2), "completed"),
        (jobs.rt_async_raise_base, ("JobHalt",), "discarded"),
        (jobs.add, (1, 2), "completed"),
    ],
    ids=["async-completed", "async-discarded", "sync-completed"],
)
def test_signals__orm_receivers_work_for_every_job_in_a_real_worker(
    tx_engine: BaseEngine, processes: Processes, fn: object, args: tuple, state: str
) -> None:
    added = insert_many(tx_engine, fn, [(args, {}) for _ in range(3)])
    proc = processes.start("--burst", "--queues", "default:2", overrides=RECEIVERS)
    assert proc.wait(120) == 0, processes.logs()
    assert {get(tx_engine, j).state for j in added} == {state}
    notes = Counter(Effect.objects.values_list("job_id", "note"))
    for job in added:
        assert notes[(job.id, "started")] == 1, processes.logs()
        assert notes[(job.id, f"finished {state}")] == 1, processes.logs()
    assert "SynchronousOnlyOperation" not in processes.logs()
