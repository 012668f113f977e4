"""An in-process worker gives back what it took: its event loop, its file descriptors."""

from __future__ import annotations

import gc
import os
import warnings

from django_hopper.engine.base import BaseEngine
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
