"""The worker's lifecycle in-process: lease, fence, cancellation, burst, loop, shutdown,
and the leader's services."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time

import pytest

from django_hopper.engine.params import ClientRegisterParams, JobCancelParams, JobClaimParams
from django_hopper.exceptions import DatabaseError, DatabaseUnavailable
from django_hopper.maintenance import (
    ClientPruner,
    Elector,
    ExpiredJobDiscarder,
    Rescuer,
    Scheduler,
)
from django_hopper.models import Client
from django_hopper.worker import Worker, WorkerConfig
from tests.factories import aware_utc
from tests.support.runtime import get, insert, insert_many, wait_for
from tests.testapp import jobs
from tests.testapp.models import Effect


def expire_lease(engine, client_id: int) -> None:
    Client.objects.filter(id=client_id).update(
        expires_at=aware_utc(engine.now() - dt.timedelta(minutes=1))
    )


def test_a_fenced_worker_stops_claiming_and_its_late_results_are_refused(tx_engine, make_worker):
    held = insert(tx_engine, jobs.rt_hold, 1.0)
    worker = make_worker()
    producer = worker.producers["default"]
    assert producer.claim_once() == 1
    old_client = worker.client_id
    expire_lease(tx_engine, old_client)

    assert worker.heartbeat.run_once() is False
    assert worker.fenced
    waiting = insert(tx_engine, jobs.add, 1, 2)
    assert producer.claim_once() == 0  # fenced: claims nothing

    # The rescue takes the job over while the fenced worker still runs it.
    assert Rescuer(tx_engine).run_once() == 1
    assert worker.wait_idle(10)
    assert worker.completer.refused == 1 and worker.completer.applied == 0
    row = get(tx_engine, held)
    assert row.state == "retryable"  # the late "completed" was refused by the fence
    assert row.errors[-1].rescue == "client_expired" and row.errors[-1].fence == row.fence
    assert row.output is None

    # With nothing running any more, the next heartbeat registers a new lease.
    worker.heartbeat.run_once()
    assert not worker.fenced and worker.client_id != old_client
    assert worker.run_once() >= 1
    assert get(tx_engine, waiting).state == "completed"


def test_the_renewal_applies_paused_queues(tx_engine, make_worker):
    worker = make_worker()
    worker.control.apply([], ["default"], [])
    insert(tx_engine, jobs.noop)
    assert worker.producers["default"].claim_once() == 0
    assert worker.heartbeat.run_once() is True  # the database says nothing is paused
    assert worker.producers["default"].claim_once() == 1
    worker.wait_idle(5)


def _running(engine, job) -> None:
    wait_for(lambda: Effect.objects.filter(job_id=job.id, note="started").exists())


def test_a_running_sync_job_is_cancelled_cooperatively_by_notification(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_wait_cancel, 30)
    worker = make_worker()
    worker.producers["default"].claim_once()
    _running(tx_engine, job)
    tx_engine.job_cancel(JobCancelParams(id=job.id))
    worker.control.on_message(json.dumps({"action": "cancel", "job_id": str(job.id)}))
    assert worker.wait_idle(5)
    row = get(tx_engine, job)
    assert row.state == "canceled"
    assert row.errors[-1].rescue == "canceled"


def test_a_running_async_job_is_cancelled_through_asyncio_on_renewal(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_async_wait_cancel, 30)
    worker = make_worker()
    worker.producers["default"].claim_once()
    _running(tx_engine, job)
    tx_engine.job_cancel(JobCancelParams(id=job.id))
    worker.heartbeat.run_once()  # the renewal reports the cancel request (missed notification)
    assert worker.wait_idle(5)
    assert get(tx_engine, job).state == "canceled"


def test_burst_runs_every_due_job_then_returns(tx_engine):
    added = insert_many(tx_engine, jobs.add, [((i, i), {}) for i in range(25)])
    snoozer = insert(tx_engine, jobs.rt_snooze_once, delay=0)  # due again right after
    worker = Worker(WorkerConfig(queues={"default": 4}, burst=True, maintenance=False), tx_engine)
    assert worker.run(install_signals=False) == 0
    assert [get(tx_engine, j).output for j in added] == [2 * i for i in range(25)]
    assert get(tx_engine, snoozer).state == "completed"
    assert not Client.objects.exists()  # the lease was deleted


def _burst_claims(tx_engine, debounce: float) -> tuple[int, float]:
    """Insert 60 jobs one by one, waking the idle producer after each as a
    notification would; return the claims it made and how long the burst took."""
    worker = Worker(
        WorkerConfig(
            queues={"default": 100},
            maintenance=False,
            poll_interval=30.0,
            claim_debounce=debounce,
        ),
        tx_engine,
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        producer = worker.producers["default"]
        wait_for(lambda: producer.claims >= 1)  # the start-up claim
        time.sleep(0.05)
        before = producer.claims
        started = time.monotonic()
        inserted = []
        for i in range(60):
            inserted.append(insert(tx_engine, jobs.add, i, 1))
            producer.wake.set()
            time.sleep(0.0005)
        took = time.monotonic() - started
        wait_for(lambda: all(get(tx_engine, j).state == "completed" for j in inserted))
        return producer.claims - before, took
    finally:
        worker.stop()
        thread.join(15)


def test_a_burst_of_wake_ups_costs_one_claim_per_debounce_interval(tx_engine):
    claims, took = _burst_claims(tx_engine, debounce=0.05)
    # One claim at the burst's first wake-up (leading edge), then at most one per 50 ms.
    assert 1 <= claims <= took / 0.05 + 2, (claims, took)


def test_without_debounce_every_wake_up_may_claim(tx_engine):
    claims, took = _burst_claims(tx_engine, debounce=0)
    debounced_bound = took / 0.05 + 2
    assert claims > debounced_bound, (claims, took)  # the debounce test is not vacuous


def test_the_loop_claims_jobs_inserted_while_it_runs_and_stops_gracefully(tx_engine):
    worker = Worker(WorkerConfig(queues={"default": 3}, maintenance=True), tx_engine)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_for(lambda: worker.client_id is not None)
        inserted = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(10)])
        wait_for(lambda: all(get(tx_engine, j).state == "completed" for j in inserted))
        held = insert(tx_engine, jobs.rt_hold, 0.5)
        wait_for(lambda: get(tx_engine, held).state == "running")
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()
    assert get(tx_engine, held).state == "completed"  # the running job was let finish
    assert not Client.objects.exists()
    assert tx_engine.leader_get() is None  # it resigned


def test_start_up_waits_for_an_unavailable_database_instead_of_exiting(tx_engine, monkeypatch):
    real = tx_engine.client_register
    calls = []

    def flaky(params):
        calls.append(params)
        if len(calls) < 3:
            raise DatabaseUnavailable("terminating connection due to administrator command")
        return real(params)

    monkeypatch.setattr(tx_engine, "client_register", flaky)
    job = insert(tx_engine, jobs.add, 2, 3)
    worker = Worker(WorkerConfig(queues={"default": 2}, burst=True, maintenance=False), tx_engine)
    assert worker.run(install_signals=False) == 0
    assert len(calls) == 3
    assert get(tx_engine, job).output == 5


def test_start_up_fails_at_once_on_an_error_that_retrying_cannot_fix(tx_engine, monkeypatch):
    def broken(params):
        raise DatabaseError('relation "hopper_client" does not exist')

    monkeypatch.setattr(tx_engine, "client_register", broken)
    worker = Worker(WorkerConfig(queues={"default": 2}, burst=True, maintenance=False), tx_engine)
    with pytest.raises(DatabaseError, match="does not exist"):
        worker.run(install_signals=False)


def test_a_shutdown_timeout_leaves_the_running_job_to_the_rescue(tx_engine):
    worker = Worker(
        WorkerConfig(queues={"default": 1}, maintenance=False, shutdown_timeout=0.2), tx_engine
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    held = insert(tx_engine, jobs.rt_hold, 1.5)
    wait_for(lambda: get(tx_engine, held).state == "running")
    execution = wait_for(lambda: next(iter(worker.executions.values()), None))
    worker.stop()
    thread.join(10)
    assert worker.stranded == 1
    assert get(tx_engine, held).state == "running"
    assert Rescuer(tx_engine).run_once() == 1  # the lease is gone: rescuable at once
    row = get(tx_engine, held)
    assert row.state == "retryable" and row.errors[-1].rescue == "client_expired"
    assert execution.done.wait(5)  # let the stray thread end before the database is flushed


# ---------------------------------------------------------------------------
# Leader and services


def _client(engine, ttl: float = 30) -> int:
    return engine.client_register(ClientRegisterParams(hostname="t", ttl=dt.timedelta(seconds=ttl)))


def test_exactly_one_elector_leads_and_a_resignation_hands_over_at_once(tx_engine):
    a, b = _client(tx_engine), _client(tx_engine)
    first = Elector(tx_engine, lambda: a, ttl=10)
    second = Elector(tx_engine, lambda: b, ttl=10)
    assert first.run_once() is True
    assert second.run_once() is False
    assert first.run_once() is True  # renewal
    first.resign()
    assert second.run_once() is True
    assert tx_engine.leader_get() == b


def test_the_rescuer_ends_stuck_jobs_of_live_clients(tx_engine):
    job = insert(tx_engine, jobs.noop)
    client = _client(tx_engine, ttl=600)
    (claimed,) = tx_engine.job_claim(
        JobClaimParams(queue="default", client_id=client, limit=1)
    ).jobs
    rescuer = Rescuer(tx_engine, stuck_after=60)
    assert rescuer.run_once() == 0  # not stuck yet
    assert rescuer.run_once(now=tx_engine.now() + dt.timedelta(seconds=120)) == 1
    row = get(tx_engine, job)
    assert row.state == "retryable"
    assert row.errors[-1].rescue == "stuck" and row.errors[-1].fence == claimed.fence


def test_the_rescuer_discards_a_job_out_of_attempts_and_cancels_a_cancel_requested_one(
    tx_engine,
):
    last = insert(tx_engine, jobs.send_email.using(queue="default", max_attempts=1), "a@b.c")
    cancel = insert(tx_engine, jobs.noop)
    client = _client(tx_engine)
    tx_engine.job_claim(JobClaimParams(queue="default", client_id=client, limit=2))
    tx_engine.job_cancel(JobCancelParams(id=cancel.id))
    expire_lease(tx_engine, client)
    assert Rescuer(tx_engine).run_once() == 2
    assert get(tx_engine, last).state == "discarded"
    assert get(tx_engine, cancel).state == "canceled"


def test_scheduler_expiry_and_pruning_services_run_once(tx_engine):
    scheduled = insert(tx_engine, jobs.noop.using(run_after=dt.timedelta(seconds=30)))
    expiring = insert(tx_engine, jobs.noop.using(ttl=dt.timedelta(seconds=30)))
    gone = _client(tx_engine, ttl=1)
    later = tx_engine.now() + dt.timedelta(seconds=60)
    assert Scheduler(tx_engine).run_once(now=later) >= 1
    assert get(tx_engine, scheduled).state == "available"
    assert ExpiredJobDiscarder(tx_engine).run_once(now=later) == 1
    assert get(tx_engine, expiring).state == "discarded"
    assert ClientPruner(tx_engine).run_once(now=later) >= 1
    assert not Client.objects.filter(id=gone).exists()
