"""Operator controls as the leader and the api see them: disabled periodic jobs, run now,
paused consumers, and stream appends waking the leader's pump."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from django_hopper import periodic, streams
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobListParams,
    PeriodicDisableParams,
    PeriodicEnableParams,
    StreamAppendParams,
)
from django_hopper.exceptions import NotFound
from django_hopper.maintenance import PeriodicEnqueuer
from django_hopper.maintenance.leader import Elector, Maintainer
from django_hopper.maintenance.services import StreamPumper
from django_hopper.periodic import define_periodic
from django_hopper.types import CHANNEL_INSERT, CHANNEL_STREAM, Notification, StreamConsumerRow
from django_hopper.worker.control import ControlState
from django_hopper.worker.notifier import Notifier
from tests.maintenance.conftest import register_client

HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
KIND = "tests.route_runtime"


def jobs_of(engine: BaseEngine, kind: str) -> list:
    return engine.job_list(JobListParams(kinds=(kind,), limit=1000))


# -- periodic: the leader skips disabled jobs and never catches up what fell meanwhile ----


def test_enqueuer__skips_a_disabled_job_and_does_not_catch_up_after_enable(
    engine: BaseEngine,
) -> None:
    start = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    definition = define_periodic(KIND, every=HOUR, name="hourly", catch_up="once")
    leader = PeriodicEnqueuer(engine, register_client(engine, start, ttl=10 * DAY), [definition])
    assert len(leader.enqueue(start + dt.timedelta(seconds=5)).inserted) == 1

    engine.periodic_disable(PeriodicDisableParams(name="hourly", now=start + HOUR / 2))
    skipped = leader.enqueue(start + HOUR + dt.timedelta(seconds=5))
    assert (skipped.inserted, skipped.disabled) == ([], ["hourly"])

    # Enabled at 05:30 after three missed slots: none is caught up, 06:00 is on time.
    engine.periodic_enable(PeriodicEnableParams(name="hourly", now=start + 5.5 * HOUR))
    assert leader.enqueue(start + 5.6 * HOUR).inserted == []
    (on_time,) = leader.enqueue(start + 6 * HOUR + dt.timedelta(seconds=5)).inserted
    assert on_time.slot == start + 6 * HOUR
    assert len(jobs_of(engine, KIND)) == 2


# -- periodic: the api's run now, disable and enable ------------------------------------


@pytest.fixture
def daily(engine: BaseEngine) -> PeriodicEnqueuer:
    """A registered daily job whose slot (today, 00:00 UTC) is always within its grace."""
    definition = define_periodic(KIND, every=DAY, grace=2 * DAY, name="daily")
    now = engine.now()
    leader = PeriodicEnqueuer(engine, register_client(engine, now), [definition])
    leader.register(now)
    return leader


def test_run_periodic_now__takes_the_due_slot_so_the_leader_does_not_run_it_again(
    engine: BaseEngine, daily: PeriodicEnqueuer
) -> None:
    first = periodic.run_periodic_now("daily")
    assert first.inserted and first.slot is not None
    assert first.job.metadata["slot"] == first.slot.isoformat()
    assert daily.enqueue().inserted == []  # the tick finds the slot inserted

    second = periodic.run_periodic_now("daily")  # no slot due: an extra run
    third = periodic.run_periodic_now("daily")  # while it waits: the same run
    assert (second.slot, second.inserted) == (None, True)
    assert "run_now" in second.job.metadata and "slot" not in second.job.metadata
    assert (third.job.id, third.inserted) == (second.job.id, False)
    assert len(jobs_of(engine, KIND)) == 2


def test_disable_periodic__stops_the_leader_and_run_now_still_runs_it_once(
    engine: BaseEngine, daily: PeriodicEnqueuer
) -> None:
    state = periodic.disable_periodic("daily")
    assert state.disabled_at is not None
    assert daily.enqueue().inserted == []
    result = periodic.run_periodic_now("daily")
    assert (result.slot, result.inserted) == (None, True)
    assert [s.disabled_at is not None for s in periodic.periodic_states()] == [True]

    periodic.enable_periodic("daily")
    # Today's slot fell while it was disabled: settled, not caught up.
    assert daily.enqueue().inserted == []
    assert len(jobs_of(engine, KIND)) == 1


def test_periodic_controls__refuse_a_name_nobody_declares(engine: BaseEngine) -> None:
    for call in (periodic.run_periodic_now, periodic.disable_periodic, periodic.enable_periodic):
        with pytest.raises(NotFound, match="typo"):
            call("typo")
    assert periodic.periodic_states() == []


# -- streams: paused consumers and woken pumps ----------------------------------------


def consumers(engine: BaseEngine, *names_patterns: tuple[str, str]) -> None:
    engine.stream_consumer_upsert(
        [
            StreamConsumerRow(name=n, pattern=p, kind=KIND, start="earliest")
            for n, p in names_patterns
        ]
    )


def append(engine: BaseEngine, topic: str) -> None:
    engine.stream_append(StreamAppendParams(topic=topic))


def delivered_to(engine: BaseEngine) -> list[str]:
    return sorted(j.metadata["consumer"] for j in jobs_of(engine, KIND))


@pytest.mark.django_db(transaction=True)
def test_stream_pumper__skips_paused_consumers_and_pumps_only_the_woken_topics(
    tx_engine: BaseEngine,
) -> None:
    consumers(tx_engine, ("orders", "orders.#"), ("users", "users.#"), ("paused", "#"))
    streams.pause_consumer("paused")
    append(tx_engine, "orders.created")
    append(tx_engine, "users.created")
    pumper = StreamPumper(tx_engine)

    assert pumper.run_once(topics={"orders.created"}) == 1
    assert delivered_to(tx_engine) == ["orders"]
    assert pumper.run_once() == 1
    assert delivered_to(tx_engine) == ["orders", "users"]
    streams.resume_consumer("paused")
    assert pumper.run_once() == 2


@pytest.mark.django_db(transaction=True)
def test_maintainer__pumps_the_woken_topics_while_leading_and_drops_them_otherwise(
    tx_engine: BaseEngine,
) -> None:
    consumers(tx_engine, ("orders", "orders.#"), ("users", "users.#"))
    cid = register_client(tx_engine, tx_engine.now())
    leading = Maintainer(
        tx_engine, Elector(tx_engine, lambda: cid, ttl=15), interval=60.0,
        services=[StreamPumper(tx_engine)],
    )  # fmt: skip
    append(tx_engine, "orders.created")
    append(tx_engine, "users.created")

    leading.wake_streams("orders.created")
    assert leading.pump_woken() is None  # not elected yet: the leader pumps, not this one
    assert delivered_to(tx_engine) == []
    assert leading.elector.run_once()
    leading.wake_streams("orders.created")
    assert leading.pump_woken() == 1
    assert leading.pump_woken() is None  # nothing woken since
    assert delivered_to(tx_engine) == ["orders"]


@pytest.mark.django_db(transaction=True)
def test_maintainer__a_woken_topic_is_pumped_between_rounds(tx_engine: BaseEngine) -> None:
    """With a round once a minute, only the wake-up can deliver within the test."""
    consumers(tx_engine, ("orders", "orders.#"))
    cid = register_client(tx_engine, tx_engine.now())
    maintainer = Maintainer(
        tx_engine, Elector(tx_engine, lambda: cid, ttl=180), interval=60.0,
        services=[StreamPumper(tx_engine)],
    )  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=maintainer.run, args=(stop,))
    thread.start()
    try:
        for _ in range(500):  # the first round (elect, pump) is done once it leads
            if maintainer.elector.is_leader:
                break
            stop.wait(0.02)
        append(tx_engine, "orders.created")
        maintainer.wake_streams("orders.created")
        for _ in range(500):
            if delivered_to(tx_engine):
                break
            stop.wait(0.02)
        assert delivered_to(tx_engine) == ["orders"]
    finally:
        stop.set()
        maintainer.wake.set()
        thread.join(10)
    assert not thread.is_alive()


def test_notifier__hands_stream_appends_to_the_leader_only_where_maintenance_runs() -> None:
    control = ControlState()
    notifier = Notifier(None, control)  # type: ignore[arg-type]
    assert CHANNEL_STREAM not in notifier.channels()
    notifier.dispatch(Notification(CHANNEL_STREAM, "orders.created"))  # ignored

    woken: list[str] = []
    control.streams = woken.append
    assert notifier.channels() == [CHANNEL_INSERT, *notifier.channels()[1:3], CHANNEL_STREAM]
    notifier.dispatch(Notification(CHANNEL_STREAM, "orders.created"))
    assert woken == ["orders.created"]


@pytest.mark.django_db(transaction=True)
def test_maintainer__an_append_committed_in_its_process_wakes_it_without_notifications(
    tx_engine: BaseEngine,
) -> None:
    """SQLite has no notifications: an append made where the leader runs wakes it directly."""
    if tx_engine.features.supports_listen:
        pytest.skip("PostgreSQL wakes every leader through CHANNEL_STREAM (test_notifications)")
    consumers(tx_engine, ("orders", "orders.#"))
    cid = register_client(tx_engine, tx_engine.now())
    maintainer = Maintainer(
        tx_engine, Elector(tx_engine, lambda: cid, ttl=180), interval=60.0,
        services=[StreamPumper(tx_engine)],
    )  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=maintainer.run, args=(stop,))
    thread.start()
    try:
        for _ in range(500):
            if maintainer.elector.is_leader:
                break
            stop.wait(0.02)
        streams.append("orders.created", {"id": 1})  # autocommit: the wake-up is at once
        for _ in range(500):
            if delivered_to(tx_engine):
                break
            stop.wait(0.02)
        assert delivered_to(tx_engine) == ["orders"]
    finally:
        stop.set()
        maintainer.wake.set()
        thread.join(10)
    streams.append("orders.created", {"id": 2})  # a stopped maintainer no longer listens
    assert delivered_to(tx_engine) == ["orders"]
