"""End to end: a Django view takes jobs by ID and finalizes them in its own
transaction while a real worker process works the same queue; and a holder
whose lease expired is fenced while the worker takes the job over.

Exactly-once is proved by the effect rows: the view writes its ``Effect`` in
the transaction that completes the job, the worker's job writes one when it
runs, so a job finalized twice (or run by both) would have two.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

import django_hopper as hopper
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from django_hopper.exceptions import JobFenced
from django_hopper.types import RescueReason
from tests.support.runtime import Processes, get, wait_for
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.processes

#: How long a worker process may take to start and drain, on a loaded machine.
WINDOW = 90.0


def warm_worker(engine: BaseEngine, processes: Processes) -> None:
    """Start a worker on the "race" queue and wait until it has run a job."""
    processes.start("--queues", "race:4")
    warm = jobs.rt_effect.using(queue="race").enqueue()
    wait_for(lambda: get(engine, warm.job).state == "completed", WINDOW)
    Effect.objects.filter(job_id=warm.id).delete()


def test_a_view_and_a_worker_racing_for_the_same_jobs_finalize_each_exactly_once(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    warm_worker(tx_engine, processes)
    handles = jobs.rt_effect.using(queue="race").enqueue_many([{"seconds": 0.05}] * 40)
    ids = {h.id for h in handles}

    def worker_started() -> bool:
        rows = tx_engine.job_list(JobListParams(ids=tuple(ids), limit=len(ids)))
        return any(r.state != "available" for r in rows)

    wait_for(worker_started, WINDOW)
    # The view takes the jobs from the back while the worker claims from the front.
    client = Client()
    answers = [client.post(f"/jobs/{h.id}/take/") for h in reversed(handles)]

    def all_finished() -> list[Any] | None:
        rows = tx_engine.job_list(JobListParams(ids=tuple(ids), limit=len(ids)))
        return rows if all(r.finalized_at is not None for r in rows) else None

    rows = wait_for(all_finished, WINDOW)
    assert {r.state for r in rows} == {"completed"}, processes.logs()
    effects = {e.job_id: e for e in Effect.objects.filter(job_id__in=ids)}
    per_job = Counter(Effect.objects.filter(job_id__in=ids).values_list("job_id", flat=True))
    assert set(per_job.values()) == {1} and set(per_job) == ids, "a job ran twice or never"
    by_view = {r.id for r in rows if r.output == {"by": "view"}}
    for row in rows:
        effect = effects[row.id]
        assert effect.fence == row.fence
        assert (effect.note == "view") == (row.id in by_view)
    taken = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 409]
    assert len(taken) == len(by_view) and len(taken) + len(refused) == len(ids)
    assert by_view and len(by_view) < len(ids), "the view and the worker did not both win"


def test_a_holder_whose_lease_expired_is_fenced_and_the_worker_takes_the_job_over(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    warm_worker(tx_engine, processes)
    # Scheduled an hour out: only the lease runs it, until its expiry makes it due.
    handle = jobs.rt_effect.using(queue="race", run_after=dt.timedelta(hours=1)).enqueue()
    lease = hopper.claim_job(handle.id, lease=1)

    row = wait_for(lambda: (r := get(tx_engine, handle.job)).state == "completed" and r, WINDOW)

    assert row.fence == lease.fence + 1, processes.logs()
    assert row.errors[0].rescue == RescueReason.LEASE_EXPIRED
    with pytest.raises(JobFenced), transaction.atomic():
        Effect.objects.create(job_id=handle.id, fence=lease.fence, note="late holder")
        lease.complete("too late")
    with pytest.raises(JobFenced):
        lease.renew()
    assert list(Effect.objects.filter(job_id=handle.id).values_list("fence", "note")) == [
        (row.fence, "")
    ]
    assert get(tx_engine, handle.job).output == row.fence
