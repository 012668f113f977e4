"""A job whose stored values do not decode fails alone: real worker processes keep
claiming and running every other job of its queue, and its attempts end with the
reason recorded (docs/engine-semantics.md, "Values that do not decode")."""

from __future__ import annotations

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from django_hopper.types import JobRow, RescueReason
from tests.engine_conformance.support import store_raw
from tests.support.runtime import Processes, get, insert, insert_many, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.processes

POISONS = [
    ("progress", '"halfway"'),
    ("progress", "[1, 2]"),
    ("progress", '{"step": "import", "at": "not a date"}'),
    ("tags", '"urgent"'),
]


def poisoned(engine: BaseEngine, column: str, text: str, max_attempts: int) -> JobRow:
    job = insert(engine, jobs.add, 100, 1)
    store_raw(job.id, column, text)
    store_raw(job.id, "max_attempts", str(max_attempts), json=False)
    return job


def assert_failed_alone(engine: BaseEngine, job: JobRow, column: str, attempts: int) -> None:
    row = get(engine, job)
    assert row.state == "discarded", row.state
    assert row.attempt == attempts
    assert row.output is None, "the job never ran"
    assert row.decode_error is not None and row.decode_error.startswith(f"{column}: ")


@pytest.mark.parametrize(("column", "text"), POISONS, ids=[f"{c}:{t}" for c, t in POISONS])
def test_worker__keeps_running_a_queue_with_an_undecodable_job_in_it(
    tx_engine: BaseEngine, processes: Processes, column: str, text: str
) -> None:
    bad = poisoned(tx_engine, column, text, max_attempts=2)
    before = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(5)])
    worker = processes.start("--queues", "default:2")

    wait_for(lambda: all(get(tx_engine, j).state == "completed" for j in before), timeout=30)
    after = insert_many(tx_engine, jobs.add, [((i, 10), {}) for i in range(3)])
    wait_for(lambda: all(get(tx_engine, j).state == "completed" for j in after), timeout=30)
    wait_for(lambda: get(tx_engine, bad).state == "discarded", timeout=30)

    assert worker.poll() is None, processes.logs()
    assert [get(tx_engine, j).output for j in before] == [1, 2, 3, 4, 5]
    assert [get(tx_engine, j).output for j in after] == [10, 11, 12]
    assert_failed_alone(tx_engine, bad, column, attempts=2)
    if column != "errors":
        errors = get(tx_engine, bad).errors
        assert [e.rescue for e in errors] == [RescueReason.UNDECODABLE, RescueReason.UNDECODABLE]
        assert all(f"{column}: " in e.error for e in errors)
    running = tx_engine.job_list(JobListParams(states=("running",), limit=10))
    assert running == [], "no job is left running with the poison one"


def test_burst_worker__runs_the_healthy_jobs_and_exits_with_an_undecodable_one_queued(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    bad = poisoned(tx_engine, "progress", '"halfway"', max_attempts=1)
    healthy = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(4)])

    proc = processes.start("--burst", "--queues", "default:1")
    try:
        code = proc.wait(60)
    except Exception:  # pragma: no cover - the failure message needs the logs
        pytest.fail(f"the burst worker did not exit\n{processes.logs()}")

    assert code == 0, processes.logs()
    assert [get(tx_engine, j).output for j in healthy] == [1, 2, 3, 4]
    assert_failed_alone(tx_engine, bad, "progress", attempts=1)
