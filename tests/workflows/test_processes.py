"""Workflows and batches end to end: the Python API, four worker processes, kills."""

from __future__ import annotations

import random
import signal
import time
from collections import defaultdict
from typing import Any

import pytest

from django_hopper import Batch, Workflow, get_batch, get_workflow
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from tests.support.runtime import FINAL, Processes
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.processes

Q = "wf"


def start_workers(processes: Processes, n: int = 4, slots: int = 4) -> list:
    return [processes.start("--queues", f"{Q}:{slots},default:2") for _ in range(n)]


def wait_done(engine: BaseEngine, procs: Processes, check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    left = [
        (r.kind, r.state)
        for r in engine.job_list(JobListParams(limit=10_000))
        if r.state not in FINAL
    ]
    pytest.fail(f"timed out; not finished: {left[:10]}\n{procs.logs()}")


def step(name: str, **kw: Any) -> tuple:
    return (jobs.wf_step.using(queue=Q), name)


def effects() -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = defaultdict(list)
    for note, pk in Effect.objects.order_by("pk").values_list("note", "pk"):
        out[note].append(pk)
    return out


def order() -> list[str]:
    return list(Effect.objects.order_by("pk").values_list("note", flat=True))


def test_diamond__each_step_runs_once_after_its_dependencies_and_reads_outputs(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    wf = Workflow("diamond")
    fn = jobs.wf_step.using(queue=Q)
    a = wf.add(fn, "a", step="a")
    b = wf.add(fn, "b", 0.2, step="b", reads=[a])
    c = wf.add(fn, "c", step="c", reads=["a"])
    wf.add(fn, "d", step="d", reads=[b, c])
    wf.on_complete(jobs.wf_callback.using(queue=Q), "complete")
    handle = wf.enqueue()
    start_workers(processes)

    wait_done(tx_engine, processes, lambda: get_workflow(handle.id).batch.completed_at)
    wait_done(tx_engine, processes, lambda: any(n.startswith("complete:") for n in order()))

    seen = order()
    steps = [n for n in seen if len(n) == 1]
    assert sorted(steps) == ["a", "b", "c", "d"]  # each exactly once
    assert steps[0] == "a" and steps[-1] == "d"
    d = handle["d"].refresh()
    assert d.output == {"name": "d", "reads": ["b", "c"]}
    assert handle["b"].refresh().output["reads"] == ["a"]
    assert [n for n in seen if n.startswith("complete:")] == [f"complete:{handle.id}"]


def test_wide_fan_in__the_join_runs_once_after_every_branch(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    wf = Workflow("fan-in")
    fn = jobs.wf_step.using(queue=Q)
    root = wf.add(fn, "root", step="root")
    branches = [wf.add(fn, f"b{i}", step=f"b{i}", after=[root]) for i in range(60)]
    wf.add(fn, "join", step="join", reads=branches)
    handle = wf.enqueue()
    start_workers(processes)

    wait_done(tx_engine, processes, lambda: get_workflow(handle.id).batch.completed_at)

    seen = order()
    assert len(seen) == 62 and len(set(seen)) == 62
    assert seen[0] == "root" and seen[-1] == "join"
    assert handle["join"].refresh().output["reads"] == sorted(f"b{i}" for i in range(60))


def test_failure_policies__cancel_cascades_discard_discards_run_runs(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    wf = Workflow("policies")
    fn = jobs.wf_step.using(queue=Q)
    bad = wf.add(jobs.wf_fail.using(queue=Q), "bad", step="bad")
    canceled = wf.add(fn, "canceled", step="canceled", after=[bad])
    wf.add(fn, "below", step="below", after=[canceled])
    wf.add(fn, "discarded", step="discarded", after=[bad], on_failure="discard")
    wf.add(fn, "cleanup", step="cleanup", reads=[bad], on_failure="run")
    wf.on_failure(jobs.wf_callback.using(queue=Q), "failure")
    wf.on_success(jobs.wf_callback.using(queue=Q), "success")
    handle = wf.enqueue()
    start_workers(processes, n=2)

    wait_done(tx_engine, processes, lambda: any(n.startswith("failure:") for n in order()))

    got = {s: handle[s].refresh().state for s in handle.steps}
    assert got == {
        "bad": "discarded",
        "canceled": "canceled",
        "below": "canceled",
        "discarded": "discarded",
        "cleanup": "completed",
    }
    assert [n for n in order() if ":" in n] == [f"failure:{handle.id}"]
    row = get_workflow(handle.id)
    assert row.batch.failed == 4


def test_batches__callbacks_fire_once_when_the_last_jobs_finish_together(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    handles = []
    for i in range(40):
        batch = Batch(metadata={"n": i})
        # Two jobs each, the same short sleep: they finish at the same instant.
        batch.add(jobs.wf_step.using(queue=Q), f"x{i}", 0.05)
        batch.add(jobs.wf_step.using(queue=Q), f"y{i}", 0.05)
        batch.on_complete(jobs.wf_callback.using(queue=Q), "complete")
        handles.append(batch.enqueue())
    start_workers(processes)

    def all_done() -> bool:
        return sum(1 for n in order() if n.startswith("complete:")) >= 40

    wait_done(tx_engine, processes, all_done, timeout=20)
    time.sleep(0.5)  # give a duplicate callback, if any, the chance to show up

    callbacks = [n for n in order() if n.startswith("complete:")]
    assert sorted(callbacks) == sorted(f"complete:{h.id}" for h in handles)
    assert all(get_batch(h.id).completed_at is not None for h in handles)


def test_workers_killed_mid_workflow__the_workflow_still_completes(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    wf = Workflow("crashy")
    fn = jobs.wf_step.using(queue=Q)
    prev = [wf.add(fn, "l0", 0.1, step="l0")]
    for level in range(1, 5):
        prev = [
            wf.add(fn, f"l{level}.{i}", 0.1, step=f"l{level}.{i}", after=prev) for i in range(4)
        ]
    handle = wf.enqueue()
    workers = start_workers(processes)
    rng = random.Random(5)

    for _ in range(3):
        time.sleep(0.6)
        victim = rng.randrange(len(workers))
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim] = processes.start("--queues", f"{Q}:4,default:2")

    wait_done(tx_engine, processes, lambda: get_workflow(handle.id).batch.completed_at, 20)

    row = get_workflow(handle.id)
    assert [j.state for j in row.jobs] == ["completed"] * 17
    ran = effects()
    assert set(ran) == {j.step for j in row.jobs}
