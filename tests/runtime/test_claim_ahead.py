"""Claims ahead of the free slots, in one worker: the buffer starts jobs as slots
free, gives back what never started (stop, cancel, a wait too long), and only while
the queue's jobs are short."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_hopper.engine.params import JobCancelParams
from django_hopper.models import Job
from django_hopper.worker import producer as producer_module
from django_hopper.worker.worker import default_ahead
from tests.support.runtime import get, insert, insert_many, wait_for
from tests.testapp import jobs


def marked(job) -> bool:
    return Job.objects.get(id=job.id).claimed_ahead_at is not None


@pytest.fixture
def short_jobs(make_worker):
    """A worker of one slot and two buffered jobs whose queue's jobs proved short."""

    def make(**config):
        with override_settings(HOPPER={"CLAIM_AHEAD": 2}):
            worker = make_worker(queues={"default": 1}, **config)
        worker.producers["default"].mean_run = 0.0
        return worker

    return make


def test_a_claim_takes_the_free_slots_and_buffers_the_rest_marked_ahead(tx_engine, short_jobs):
    held = [insert(tx_engine, jobs.rt_hold, 0.3) for _ in range(4)]
    worker = short_jobs()
    producer = worker.producers["default"]

    assert producer.claim_once() == 3
    assert [j.id for j, _at in producer.buffer] == [held[1].id, held[2].id]
    assert [marked(j) for j in held[:3]] == [False, True, True]
    assert get(tx_engine, held[3]).state == "available"
    assert producer.free() == 0  # the slot and the buffer are both full

    # As the slot frees, the buffered jobs start in claim order, with no claim.
    assert worker.wait_idle(10)
    assert [get(tx_engine, j).state for j in held[:3]] == ["completed"] * 3
    assert producer.claims == 1


def test_shutdown_gives_the_buffer_back_unstarted_with_the_attempt(tx_engine, short_jobs):
    held = [insert(tx_engine, jobs.rt_hold, 0.3) for _ in range(3)]
    worker = short_jobs()
    producer = worker.producers["default"]
    assert producer.claim_once() == 3

    worker.shutdown()

    assert get(tx_engine, held[0]).state == "completed"
    for job in held[1:]:
        row = get(tx_engine, job)
        assert (row.state, row.attempt, row.fence, row.errors) == ("available", 0, 1, [])
        assert not marked(row)
        assert Job.objects.get(id=job.id).admission_misses is None
    assert producer.returned == 2


def test_a_cancel_ends_a_buffered_job_without_running_it(tx_engine, short_jobs):
    held = [insert(tx_engine, jobs.rt_hold, 0.3) for _ in range(3)]
    worker = short_jobs()
    assert worker.producers["default"].claim_once() == 3

    tx_engine.job_cancel(JobCancelParams(id=held[2].id))
    assert worker.cancel_job(held[2].id)

    assert worker.wait_idle(10)
    row = get(tx_engine, held[2])
    assert row.state == "canceled" and row.errors[-1].error == "canceled before it started"
    assert get(tx_engine, held[1]).state == "completed"


def test_a_buffered_job_waiting_too_long_goes_back_and_claims_stop_going_ahead(
    tx_engine, short_jobs, monkeypatch
):
    monkeypatch.setattr(producer_module, "AHEAD_MAX_WAIT", 0.0)
    held = [insert(tx_engine, jobs.rt_hold, 0.5) for _ in range(3)]
    worker = short_jobs()
    producer = worker.producers["default"]
    assert producer.claim_once() == 3

    assert producer.return_stale() == 2

    for job in held[1:]:
        row = get(tx_engine, job)
        assert (row.state, row.attempt) == ("available", 0)
    assert producer.mean_run >= producer_module.AHEAD_MAX_RUN
    assert producer.free() == 0  # the one slot is busy and nothing goes ahead now
    assert worker.wait_idle(10)


def test_slow_jobs_turn_claims_ahead_off(tx_engine, make_worker):
    insert_many(tx_engine, jobs.rt_hold, [((0.05,), {}) for _ in range(3)])
    with override_settings(HOPPER={"CLAIM_AHEAD": 2}):
        worker = make_worker(queues={"default": 1})
    producer = worker.producers["default"]

    assert producer.claim_once() == 1  # not proven short yet: no claim ahead
    assert worker.wait_idle(10)
    assert producer.mean_run >= producer_module.AHEAD_MAX_RUN
    assert producer.claim_once() == 1


def test_claim_ahead_zero_turns_it_off(tx_engine, make_worker):
    insert_many(tx_engine, jobs.add, [((i, 0), {}) for i in range(3)])
    with override_settings(HOPPER={"CLAIM_AHEAD": 0}):
        worker = make_worker(queues={"default": 1})
    producer = worker.producers["default"]
    producer.mean_run = 0.0

    assert producer.claim_once() == 1
    wait_for(lambda: worker.wait_idle(5))


def test_a_buffered_job_the_rescue_took_is_not_reported_canceled(tx_engine, short_jobs):
    from django.db.models import F

    from django_hopper import signals

    held = [insert(tx_engine, jobs.rt_hold, 0.3) for _ in range(3)]
    worker = short_jobs()
    producer = worker.producers["default"]
    assert producer.claim_once() == 3
    # The rescue took the second job (its worker was fenced meanwhile): it is
    # another claim's now, and will run elsewhere.
    Job.objects.filter(id=held[1].id).update(
        state="available", fence=F("fence") + 1, claimed_ahead_at=None
    )
    finished = []

    def receiver(sender, job, state, **kwargs):
        finished.append((job.id, state))

    signals.job_finished.connect(receiver)
    try:
        assert producer.return_buffer() == 1
        assert worker.wait_idle(10)
    finally:
        signals.job_finished.disconnect(receiver)
    assert (held[1].id, "canceled") not in finished
    assert get(tx_engine, held[1]).state == "available"
    assert get(tx_engine, held[2]).state == "available"


def test_a_return_whose_answer_is_lost_never_starts_the_jobs_it_may_have_given_back(
    tx_engine, short_jobs, monkeypatch
):
    from django_hopper import signals
    from django_hopper.exceptions import DatabaseUnavailable

    held = [insert(tx_engine, jobs.rt_hold, 0.3) for _ in range(3)]
    worker = short_jobs()
    producer = worker.producers["default"]
    assert producer.claim_once() == 3
    real = producer.engine.job_return_many

    def committed_then_lost(params):
        real(params)  # the statement committed; its answer never arrived
        raise DatabaseUnavailable("the connection was lost")

    monkeypatch.setattr(producer.engine, "job_return_many", committed_then_lost)
    started = []

    def receiver(sender, job, **kwargs):
        started.append(job.id)

    signals.job_started.connect(receiver)
    try:
        with pytest.raises(DatabaseUnavailable):
            producer.return_buffer()
        assert worker.wait_idle(10)
        # The freed slot starts none of them: they may be another worker's now.
        assert started == [] or started == [held[0].id]
        monkeypatch.setattr(producer.engine, "job_return_many", real)
        assert producer.return_stale() == 0  # given back already: nothing of that claim
    finally:
        signals.job_started.disconnect(receiver)
    for job in held[1:]:
        row = get(tx_engine, job)
        assert (row.state, row.attempt) == ("available", 0)
    assert not producer.buffer


def test_by_default_a_full_claim_carries_a_hundred_jobs_or_five_per_slot():
    assert [default_ahead(c) for c in (1, 10, 20, 25, 100)] == [99, 90, 80, 100, 400]


def test_the_buffer_holds_what_the_slots_run_in_the_fill_time(make_worker):
    with override_settings(HOPPER={"CLAIM_AHEAD": 100}):
        worker = make_worker(queues={"default": 2})
    producer = worker.producers["default"]

    producer.mean_run = 0.004  # short, but 100 of them would wait 0.2 s for two slots
    assert producer.free() == 2 + int(2 * producer_module.AHEAD_FILL / 0.004)
    producer.mean_run = 0.0
    assert producer.free() == 2 + 100


def test_after_a_full_claim_the_next_waits_for_room_while_buffered_jobs_feed_the_slot(
    tx_engine, make_worker
):
    held = [insert(tx_engine, jobs.rt_hold, 2.0) for _ in range(8)]
    with override_settings(HOPPER={"CLAIM_AHEAD": 4}):
        worker = make_worker(queues={"default": 1})
    producer = worker.producers["default"]
    producer.mean_run = 0.0
    assert producer.claim_once() == 5  # the slot and a full buffer

    # Room for one job, and buffered jobs still behind the busy slot: a claim of one
    # would cost a round trip for little, so none is sent...
    assert producer.take_buffered(held[1].id) is not None
    assert producer.claim_once() == 0
    assert producer.claims == 1
    # ...until half of a full claim's room is free.
    assert producer.take_buffered(held[2].id) is not None
    assert producer.claim_once() == 2
    assert [j.id for j, _at in producer.buffer] == [h.id for h in (held[3], held[4], *held[5:7])]


def test_a_claim_after_one_that_did_not_fill_its_room_takes_four_jobs_a_slot_ahead(
    tx_engine, make_worker
):
    for _ in range(30):
        insert(tx_engine, jobs.rt_hold, 2.0)
    with override_settings(HOPPER={"CLAIM_AHEAD": 100}):
        worker = make_worker(queues={"default": 2})
    producer = worker.producers["default"]
    producer.mean_run = 0.0

    # The first claim (as a wake-up's for one new job would be) takes the smaller limit...
    assert producer.claim_once() == 2 + producer_module.IDLE_AHEAD_PER_SLOT * 2
    assert producer.full
    # ...and once a claim came back full, the next takes the whole buffer's room.
    assert producer.claim_once() == 30 - 10
    assert len(producer.buffer) == 28


@pytest.mark.parametrize(
    "control",
    [
        pytest.param({"paused": ["default"], "limited": []}, id="paused"),
        pytest.param({"paused": [], "limited": ["default"]}, id="limited"),
    ],
)
def test_a_queue_paused_or_limited_after_a_claim_starts_none_of_its_buffer_and_gives_it_back(
    tx_engine, short_jobs, control
):
    from django_hopper import signals

    held = [insert(tx_engine, jobs.rt_hold, 0.3) for _ in range(3)]
    worker = short_jobs()
    producer = worker.producers["default"]
    assert producer.claim_once() == 3
    started = []

    def receiver(sender, job, **kwargs):
        started.append(job.id)

    signals.job_started.connect(receiver)
    try:
        # A lease renewal (or the control notification) tells the worker.
        worker.control.apply([], control["paused"], control["limited"])
        assert worker.wait_idle(10)
        # The freed slot starts no buffered job: the queue is paused, or its
        # limits count running jobs a buffer would overshoot.
        assert held[1].id not in started and held[2].id not in started
        mean = producer.mean_run
        assert producer.return_stale() == 2  # the producer's next round gives them back
    finally:
        signals.job_started.disconnect(receiver)
    for job in held[1:]:
        row = get(tx_engine, job)
        assert (row.state, row.attempt, row.errors) == ("available", 0, [])
        assert not marked(row)
        assert Job.objects.get(id=job.id).admission_misses is None
    # Not a sign of slow jobs: the mean run time that lets claims go ahead is kept.
    assert producer.mean_run == mean
