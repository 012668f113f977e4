"""An in-process worker gives back what it took: its event loop, its file descriptors;
the worker process freezes its start-up heap, an embedding process keeps its collector."""

from __future__ import annotations

import gc
import os
import warnings
import weakref

import pytest
from django.core.management import call_command

from django_hopper.engine.base import BaseEngine
from django_hopper.management.commands import hopper_worker
from django_hopper.worker import Worker, WorkerConfig
from tests.support.runtime import get, insert
from tests.testapp import jobs


def open_fds() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def burst(engine: BaseEngine) -> None:
    """Run a burst worker in this process over one sync and one async job."""
    done = [insert(engine, jobs.add, 1, 2), insert(engine, jobs.async_add, 2, 3)]
    worker = Worker(WorkerConfig(queues={"default": 2}, burst=True, maintenance=False), engine)
    assert worker.run(install_signals=False) == 0
    assert [get(engine, j).output for j in done] == [3, 5]


def test_worker_run__closes_its_event_loop_and_leaks_no_file_descriptor(
    tx_engine: BaseEngine,
) -> None:
    burst(tx_engine)  # the first run imports and connects what every later run reuses
    gc.collect()
    before = open_fds()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(5):
            burst(tx_engine)
        # Counted before a collection: the worker closes what it opened itself.
        assert open_fds() <= before
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


class Node:
    """An object that can refer to itself (a cycle only the collector frees)."""

    me: Node | None = None


def test_worker_run__freezes_the_start_up_heap_and_still_collects_garbage_made_after(
    tx_engine: BaseEngine,
) -> None:
    gc.unfreeze()
    try:
        done = [insert(tx_engine, jobs.add, 1, 2)]
        config = WorkerConfig(
            queues={"default": 2}, burst=True, maintenance=False, freeze_heap=True
        )
        assert Worker(config, tx_engine).run(install_signals=False) == 0
        assert get(tx_engine, done[0]).output == 3

        assert gc.get_freeze_count() > 0  # start-up's objects left the collector's passes
        cycle = Node()
        cycle.me = cycle
        ref = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert ref() is None  # what the jobs make afterwards is collected as before
    finally:
        gc.unfreeze()


def test_worker_run__leaves_an_embedding_processs_collector_alone_by_default(
    tx_engine: BaseEngine,
) -> None:
    gc.unfreeze()
    burst(tx_engine)
    assert gc.get_freeze_count() == 0


def test_hopper_worker__freezes_the_heap_of_its_process(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs: list[WorkerConfig] = []

    class FakeWorker:
        stranded = 0

        def __init__(self, config: WorkerConfig, engine: BaseEngine) -> None:
            configs.append(config)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(hopper_worker, "Worker", FakeWorker)
    call_command("hopper_worker", "--queues", "default:1", "--burst")

    assert [c.freeze_heap for c in configs] == [True]
