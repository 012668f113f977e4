"""erase_subject against a worker: a job erased while it runs stores nothing afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_hopper import erase_subject, get_job, job_logs, retry_job, subject_erasures
from django_hopper.engine.base import BaseEngine
from django_hopper.exceptions import JobErased
from django_hopper.types import JobState
from tests.support.runtime import wait_for
from tests.testapp import jobs
from tests.testapp.models import Effect


@pytest.fixture
def gate() -> Iterator[None]:
    jobs.GATE.clear()
    yield
    jobs.GATE.set()


@pytest.mark.usefixtures("gate")
def test_erase_subject__a_job_running_through_the_erasure_writes_nothing_back(
    tx_engine: BaseEngine, make_worker: Any
) -> None:
    handle = jobs.rt_gate.using(subject="user:1").enqueue("Ada")
    other = jobs.rt_gate.using(subject="user:2").enqueue("Bob")
    worker = make_worker(queues={"default": 2})
    assert sum(p.claim_once() for p in worker.producers.values()) == 2  # started, not awaited
    wait_for(lambda: Effect.objects.filter(note="started").count() == 2)

    erasure = erase_subject("user:1")
    jobs.GATE.set()
    assert worker.wait_idle(10)

    row = get_job(handle.id)
    assert row.state == JobState.DISCARDED and row.erased_at is not None
    assert (row.args, row.output, row.progress, row.errors) == ({}, None, None, [])
    assert job_logs(handle.id) == []
    assert (erasure.jobs, erasure.running) == (1, 1)
    assert [e.id for e in subject_erasures("user:1")] == [erasure.id]
    assert subject_erasures("user:2") == []
    kept = get_job(other.id)
    assert kept.state == JobState.COMPLETED and kept.output == {"greeted": "Bob"}
    with pytest.raises(JobErased):
        retry_job(handle.id)
