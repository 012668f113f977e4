"""The leader's PeriodicEnqueuer: one job per slot across racing and changing leaders."""

from __future__ import annotations

import collections
import datetime as dt
import threading
from collections.abc import Callable

import pytest
from django.db import connections

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from django_hopper.maintenance import PeriodicEnqueuer
from django_hopper.periodic import PeriodicDefinition, define_periodic
from tests.maintenance.conftest import register_client

SECOND = dt.timedelta(seconds=1)


def every_second(kind: str) -> PeriodicDefinition:
    return define_periodic(kind, every=SECOND, name=kind)


def slots_of(engine: BaseEngine, kind: str) -> collections.Counter[str]:
    """Count the jobs of a periodic kind per slot (from the metadata the slot writes)."""
    jobs = engine.job_list(JobListParams(kinds=(kind,), limit=10_000))
    return collections.Counter(job.metadata["slot"] for job in jobs)


def second_start(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=0)


def in_threads(*calls: Callable[[], object]) -> None:
    """Run the calls at the same moment, each on its own connection; re-raise failures."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            barrier.wait()
            call()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


@pytest.mark.django_db(transaction=True)
def test_racing_leaders_insert_each_slot_exactly_once(tx_engine: BaseEngine) -> None:
    start = second_start(tx_engine.now()) + SECOND
    definition = every_second("tests.race")
    leaders = [
        PeriodicEnqueuer(tx_engine, register_client(tx_engine, start), [definition])
        for _ in range(2)
    ]
    for step in range(10):
        now = start + step * SECOND + dt.timedelta(milliseconds=300)
        in_threads(*(lambda lead=lead, now=now: lead.run_once(now) for lead in leaders))
    counts = slots_of(tx_engine, "tests.race")
    assert len(counts) == 10
    assert set(counts.values()) == {1}


def test_a_leader_change_mid_slot_does_not_repeat_the_slot(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    start = second_start(db_now) + SECOND
    definition = every_second("tests.handover")
    old = PeriodicEnqueuer(engine, register_client(engine, start), [definition])
    for step in range(5):
        old.run_once(start + step * SECOND + dt.timedelta(milliseconds=100))
    # The old leader stops in the middle of slot 4; a new one, with no memory
    # of what the old one did, takes over within the same slot.
    new = PeriodicEnqueuer(engine, register_client(engine, start), [definition])
    first = new.enqueue(start + 4 * SECOND + dt.timedelta(milliseconds=700))
    assert first.inserted == []
    assert first.raced == []  # the slot was recorded: it was not even due
    for step in range(5, 10):
        new.run_once(start + step * SECOND + dt.timedelta(milliseconds=100))
    counts = slots_of(engine, "tests.handover")
    assert len(counts) == 10
    assert set(counts.values()) == {1}


def test_a_one_second_interval_over_ten_seconds_makes_ten_jobs(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    start = db_now
    leader = PeriodicEnqueuer(engine, register_client(engine, start), [every_second("tests.tick")])
    step = dt.timedelta(milliseconds=250)
    for i in range(40):  # ten seconds of simulated time
        leader.run_once(start + i * step)
    total = sum(slots_of(engine, "tests.tick").values())
    assert 9 <= total <= 11


def test_the_newest_clients_definition_wins(engine: BaseEngine, db_now: dt.datetime) -> None:
    now = second_start(db_now)
    old_def = define_periodic("tests.v1", every=SECOND, name="tests.versioned")
    new_def = define_periodic("tests.v2", every=SECOND, name="tests.versioned")
    old = PeriodicEnqueuer(engine, register_client(engine, now - SECOND), [old_def])
    new = PeriodicEnqueuer(engine, register_client(engine, now), [new_def])
    assert new.run_once(now) == 1
    # The old client leads in the next slot, and inserts what the newest client declared.
    result = old.enqueue(now + SECOND + dt.timedelta(milliseconds=100))
    assert [s.name for s in result.inserted] == ["tests.versioned"]
    assert sum(slots_of(engine, "tests.v2").values()) == 2
    assert sum(slots_of(engine, "tests.v1").values()) == 0
