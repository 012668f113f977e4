"""Operator controls of subscriptions, stream consumers and periodic jobs (both engines).

Pause, resume and delete of subscriptions (what becomes of their deliveries);
pause, resume, reset, delete and lag of stream consumers; disable, enable and
run now of periodic jobs, whose run now never double-fires a slot.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobInsertParams,
    JobListParams,
    JobScheduleParams,
    MessagePublishParams,
    PeriodicDisableParams,
    PeriodicEnableParams,
    PeriodicInsertParams,
    PeriodicRunNowParams,
    StreamAppendParams,
    StreamConsumerDeleteParams,
    StreamConsumerLagParams,
    StreamConsumerPauseParams,
    StreamConsumerResetParams,
    StreamConsumerResumeParams,
    SubscriptionDeleteParams,
    SubscriptionPauseParams,
    SubscriptionResumeParams,
)
from django_hopper.exceptions import InvalidJob, NotFound
from django_hopper.types import (
    HELD_AT,
    JobRow,
    JobState,
    StreamConsumerRow,
    StreamStart,
    SubscriptionRow,
)
from tests.engine_conformance.support import HOUR, MINUTE, SECOND, claim
from tests.engine_conformance.test_streams import open_transaction_appending

KIND = "tests.route_subscriber"


def subscribe(engine: BaseEngine, now: dt.datetime, name: str = "s", pattern: str = "#") -> None:
    engine.subscription_upsert(
        [SubscriptionRow(name=name, pattern=pattern, kind=KIND, queue="subs")], now=now
    )


def publish(engine: BaseEngine, now: dt.datetime, topic: str = "orders.created") -> None:
    engine.message_publish(MessagePublishParams(topic=topic, payload={"t": topic}, now=now))


def deliveries(engine: BaseEngine, kind: str = KIND) -> list[JobRow]:
    return engine.job_list(JobListParams(kinds=(kind,), limit=1000))


def by_state(engine: BaseEngine, kind: str = KIND) -> dict[str, int]:
    out: dict[str, int] = {}
    for job in deliveries(engine, kind):
        out[job.state] = out.get(job.state, 0) + 1
    return out


# -- subscriptions ------------------------------------------------------------------


def test_subscription_pause__holds_deliveries_until_resume_releases_them(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    subscribe(engine, db_now)
    publish(engine, db_now, "before.pause")
    paused = engine.subscription_pause(SubscriptionPauseParams(name="s", now=db_now))
    assert paused.paused_at == db_now
    publish(engine, db_now + SECOND, "while.paused")
    publish(engine, db_now + SECOND, "while.paused")

    held = [j for j in deliveries(engine) if j.scheduled_at == HELD_AT]
    assert [j.state for j in held] == [JobState.SCHEDULED] * 2
    # Nothing promotes a held delivery, however late the clock: only the earlier one runs.
    later = db_now + dt.timedelta(days=365)
    engine.job_schedule(JobScheduleParams(now=later, limit=100))
    assert [j.args["args"][0]["topic"] for j in claim(engine, client_id, later, "subs")] == [
        "before.pause"
    ]

    result = engine.subscription_resume(SubscriptionResumeParams(name="s", now=db_now + MINUTE))
    assert result.subscription.paused_at is None
    assert (result.released, result.queues) == (2, ["subs"])
    claimed = claim(engine, client_id, db_now + MINUTE, "subs")
    assert [j.args["args"][0]["topic"] for j in claimed] == ["while.paused"] * 2


def test_subscription_pause__keeps_the_first_pause_and_survives_a_redeclaration(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now)
    engine.subscription_pause(SubscriptionPauseParams(name="s", now=db_now))
    again = engine.subscription_pause(SubscriptionPauseParams(name="s", now=db_now + HOUR))
    assert again.paused_at == db_now
    subscribe(engine, db_now + HOUR, pattern="orders.#")  # a worker starting re-declares it
    (row,) = engine.subscription_list()
    assert (row.pattern, row.paused_at) == ("orders.#", db_now)


def test_subscription_delete__keeps_its_deliveries_and_releases_the_held_ones(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now)
    publish(engine, db_now)
    engine.subscription_pause(SubscriptionPauseParams(name="s", now=db_now))
    publish(engine, db_now)

    result = engine.subscription_delete(SubscriptionDeleteParams(name="s", now=db_now + MINUTE))

    assert isinstance(result.route, SubscriptionRow) and result.route.name == "s"
    assert (result.canceled, result.released, result.queues) == (0, 1, ["subs"])
    assert engine.subscription_list() == []
    assert by_state(engine) == {JobState.AVAILABLE: 1, JobState.SCHEDULED: 1}
    assert all(j.scheduled_at < HELD_AT for j in deliveries(engine))
    publish(engine, db_now + MINUTE)  # no subscription: no delivery
    assert len(deliveries(engine)) == 2


def test_subscription_delete__cancel_pending_cancels_every_delivery_not_running(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    subscribe(engine, db_now)
    subscribe(engine, db_now, name="other")
    publish(engine, db_now)
    publish(engine, db_now)
    (running,) = claim(engine, client_id, db_now, "subs", limit=1)
    engine.subscription_pause(SubscriptionPauseParams(name="s", now=db_now))
    publish(engine, db_now)  # held for "s", available for "other"

    result = engine.subscription_delete(
        SubscriptionDeleteParams(name="s", cancel_pending=True, now=db_now)
    )

    mine = [j for j in deliveries(engine) if j.metadata.get("subscription") == "s"]
    states = sorted(j.state for j in mine)
    assert result.canceled == len([j for j in mine if j.state == JobState.CANCELED])
    if running.metadata["subscription"] == "s":
        assert states == [JobState.CANCELED] * 2 + [JobState.RUNNING]
    else:
        assert states == [JobState.CANCELED] * 3
    assert sorted(j.id for j in result.ended) == sorted(
        j.id for j in mine if j.state == JobState.CANCELED
    )
    others = [j for j in deliveries(engine) if j.metadata.get("subscription") == "other"]
    assert JobState.CANCELED not in {j.state for j in others}


def test_subscription_controls__an_unknown_name_raises_not_found_and_leaves_the_transaction_usable(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: engine.subscription_pause(SubscriptionPauseParams(name="nope")),
        lambda: engine.subscription_resume(SubscriptionResumeParams(name="nope")),
        lambda: engine.subscription_delete(SubscriptionDeleteParams(name="nope")),
        lambda: engine.subscription_delete(
            SubscriptionDeleteParams(name="nope", cancel_pending=True)
        ),
        lambda: engine.stream_consumer_pause(StreamConsumerPauseParams(name="nope")),
        lambda: engine.stream_consumer_resume(StreamConsumerResumeParams(name="nope")),
        lambda: engine.stream_consumer_reset(StreamConsumerResetParams(name="nope")),
        lambda: engine.stream_consumer_delete(StreamConsumerDeleteParams(name="nope")),
    ]
    with transaction.atomic(using=engine.alias):
        for call in calls:
            with pytest.raises(NotFound, match="nope"):
                call()
        subscribe(engine, db_now)  # the caller's transaction goes on
    assert [s.name for s in engine.subscription_list()] == ["s"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda e: e.subscription_pause(SubscriptionPauseParams(name="a b")), "name"),
        (lambda e: e.subscription_resume(SubscriptionResumeParams(name="")), "name"),
        (lambda e: e.subscription_delete(SubscriptionDeleteParams(name="s\n")), "name"),
        (
            lambda e: e.subscription_delete(
                SubscriptionDeleteParams(name="s", cancel_pending="yes")  # type: ignore[arg-type]
            ),
            "cancel_pending",
        ),
        (
            lambda e: e.subscription_pause(
                SubscriptionPauseParams(name="s", now=dt.datetime(2026, 1, 1))
            ),
            "now",
        ),
        (lambda e: e.stream_consumer_pause(StreamConsumerPauseParams(name="*")), "name"),
        (lambda e: e.stream_consumer_resume(StreamConsumerResumeParams(name="")), "name"),
        (lambda e: e.stream_consumer_reset(StreamConsumerResetParams(name="a/b")), "name"),
        (lambda e: e.stream_consumer_delete(StreamConsumerDeleteParams(name="")), "name"),
        (
            lambda e: e.stream_consumer_lag(StreamConsumerLagParams(names="c")),  # type: ignore[arg-type]
            "names",
        ),
        (lambda e: e.stream_consumer_lag(StreamConsumerLagParams(limit=0)), "limit"),
        (lambda e: e.periodic_disable(PeriodicDisableParams(name="x y")), "name"),
        (lambda e: e.periodic_enable(PeriodicEnableParams(name="")), "name"),
        (
            lambda e: e.periodic_run_now(
                PeriodicRunNowParams(
                    name="p",
                    job=JobInsertParams(kind="k"),
                    extra=JobInsertParams(kind="k"),
                    slot=dt.datetime(2026, 1, 1),
                )
            ),
            "slot",
        ),
        (
            lambda e: e.periodic_run_now(
                PeriodicRunNowParams(
                    name="p", job=JobInsertParams(kind="k"), extra=JobInsertParams(kind="")
                )
            ),
            "kind",
        ),
    ],
)
def test_route_controls__refuse_bad_input_naming_the_field(
    engine: BaseEngine, call: Callable[[BaseEngine], Any], field: str
) -> None:
    with pytest.raises(InvalidJob) as info:
        call(engine)
    assert info.value.field == field
    assert engine.subscription_list() == [] and engine.periodic_list() == []


# -- stream consumers (pumps read committed data: tx_engine) --------------------------


def consumer(engine: BaseEngine, name: str = "c", pattern: str = "#", start: str = "earliest"):
    engine.stream_consumer_upsert(
        [StreamConsumerRow(name=name, pattern=pattern, kind=KIND, queue="subs", start=start)]
    )


def append(engine: BaseEngine, topic: str = "orders.created") -> None:
    engine.stream_append(StreamAppendParams(topic=topic, payload={"t": topic}))


def get_consumer(engine: BaseEngine, name: str = "c") -> StreamConsumerRow:
    (row,) = [c for c in engine.stream_consumer_list() if c.name == name]
    return row


def test_stream_consumer_pause__pumps_nothing_and_resume_delivers_what_waited(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine)
    append(tx_engine, "a.one")
    row = tx_engine.stream_consumer_pause(StreamConsumerPauseParams(name="c"))
    assert row.paused_at is not None
    append(tx_engine, "a.two")

    result = tx_engine.stream_pump("c", 100)

    assert (result.delivered, deliveries(tx_engine)) == (0, [])
    assert get_consumer(tx_engine).position == row.position
    resumed = tx_engine.stream_consumer_resume(StreamConsumerResumeParams(name="c"))
    assert resumed.paused_at is None
    assert tx_engine.stream_pump("c", 100).delivered == 2
    topics = sorted(j.args["args"][0]["topic"] for j in deliveries(tx_engine))
    assert topics == ["a.one", "a.two"]


@pytest.mark.parametrize(("start", "replayed"), [("earliest", 2), ("latest", 0)])
def test_stream_consumer_reset__moves_back_to_its_start(
    tx_engine: BaseEngine, start: str, replayed: int
) -> None:
    append(tx_engine, "a.one")
    consumer(tx_engine, start=start)
    append(tx_engine, "a.two")
    delivered = tx_engine.stream_pump("c", 100).delivered
    assert delivered == (2 if start == StreamStart.EARLIEST else 1)
    tx_engine.stream_consumer_pause(StreamConsumerPauseParams(name="c"))

    row = tx_engine.stream_consumer_reset(StreamConsumerResetParams(name="c"))

    assert row.paused_at is not None  # a reset keeps the pause
    tx_engine.stream_consumer_resume(StreamConsumerResumeParams(name="c"))
    assert tx_engine.stream_pump("c", 100).delivered == replayed


def test_stream_consumer_delete__keeps_its_deliveries_or_cancels_the_waiting_ones(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine, name="keep")
    consumer(tx_engine, name="drop")
    append(tx_engine, "a.one")
    append(tx_engine, "a.two")
    assert tx_engine.stream_pump("keep", 100).delivered == 2
    assert tx_engine.stream_pump("drop", 100).delivered == 2

    kept = tx_engine.stream_consumer_delete(StreamConsumerDeleteParams(name="keep"))
    dropped = tx_engine.stream_consumer_delete(
        StreamConsumerDeleteParams(name="drop", cancel_pending=True)
    )

    assert (kept.route.name, kept.canceled) == ("keep", 0)
    assert (dropped.route.name, dropped.canceled) == ("drop", 2)
    assert tx_engine.stream_consumer_list() == []
    states = {(j.metadata["consumer"], j.state) for j in deliveries(tx_engine)}
    assert states == {("keep", JobState.AVAILABLE), ("drop", JobState.CANCELED)}
    # The log keeps the events: a consumer declared again reads them from its start.
    consumer(tx_engine, name="keep")
    assert tx_engine.stream_pump("keep", 100).delivered == 2


def test_stream_consumer_lag__reads_a_window_of_limit_events_whatever_their_topic(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine, name="narrow", pattern="rare.*")
    for _ in range(4):
        append(tx_engine, "common.event")
    append(tx_engine, "rare.event")

    (window,) = tx_engine.stream_consumer_lag(StreamConsumerLagParams(limit=3))
    (whole,) = tx_engine.stream_consumer_lag(StreamConsumerLagParams(limit=5))

    assert (window.events, window.capped, window.oldest_at) == (0, True, None)  # a floor
    assert (whole.events, whole.capped) == (1, False) and whole.oldest_at is not None


def test_stream_consumer_lag__counts_waiting_matching_events_up_to_the_limit(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine, name="orders", pattern="orders.#")
    consumer(tx_engine, name="users", pattern="users.*")
    consumer(tx_engine, name="idle", pattern="none.*")
    for _ in range(3):
        append(tx_engine, "orders.created")
    append(tx_engine, "users.created")

    lags = {lag.name: lag for lag in tx_engine.stream_consumer_lag(StreamConsumerLagParams())}

    assert sorted(lags) == ["idle", "orders", "users"]
    assert (lags["orders"].events, lags["orders"].capped) == (3, False)
    assert (lags["users"].events, lags["idle"].events) == (1, 0)
    assert lags["orders"].oldest_at is not None and lags["idle"].oldest_at is None
    (capped,) = tx_engine.stream_consumer_lag(StreamConsumerLagParams(names=("orders",), limit=2))
    assert (capped.name, capped.events, capped.capped) == ("orders", 2, True)
    tx_engine.stream_pump("orders", 2)
    (part,) = tx_engine.stream_consumer_lag(StreamConsumerLagParams(names=("orders",)))
    assert (part.events, part.capped) == (1, False)
    tx_engine.stream_pump("orders", 100)
    (done,) = tx_engine.stream_consumer_lag(StreamConsumerLagParams(names=("orders",)))
    assert (done.events, done.oldest_at) == (0, None)
    assert tx_engine.stream_consumer_lag(StreamConsumerLagParams(names=("unknown",))) == []


# -- periodic jobs ------------------------------------------------------------------

SLOT = dt.datetime(2026, 3, 1, 3, 0, tzinfo=dt.UTC)


def slot_job(slot: dt.datetime = SLOT) -> JobInsertParams:
    return JobInsertParams(kind="tests.periodic", metadata={"periodic": "p", "slot": str(slot)})


def extra_job() -> JobInsertParams:
    return JobInsertParams(
        kind="tests.periodic", metadata={"periodic": "p"}, unique_key="run-now:p"
    )


def leader_insert(engine: BaseEngine, slot: dt.datetime = SLOT) -> tuple[JobRow | None, bool]:
    return engine.periodic_insert(
        PeriodicInsertParams(name="p", slot=slot, job=slot_job(slot), now=slot)
    )


def run_now(engine: BaseEngine, slot: dt.datetime | None):
    return engine.periodic_run_now(
        PeriodicRunNowParams(name="p", job=slot_job(), extra=extra_job(), slot=slot, now=SLOT)
    )


def test_periodic_disable__no_slot_is_inserted_until_enabled(engine: BaseEngine) -> None:
    row = engine.periodic_disable(PeriodicDisableParams(name="p", now=SLOT))
    assert (row.name, row.last_slot, row.disabled_at) == ("p", None, SLOT)
    assert engine.periodic_disable(
        PeriodicDisableParams(name="p", now=SLOT + HOUR)
    ).disabled_at == (SLOT)

    assert leader_insert(engine) == (None, False)
    assert engine.periodic_last_slots() == {}

    enabled = engine.periodic_enable(PeriodicEnableParams(name="p", now=SLOT + MINUTE))
    assert (enabled.disabled_at, enabled.enabled_at) == (None, SLOT + MINUTE)
    assert enabled.settled == SLOT + MINUTE  # slots that fell while disabled are settled
    job, inserted = leader_insert(engine, SLOT + HOUR)
    assert inserted and job is not None
    enabled = engine.periodic_enable(PeriodicEnableParams(name="p", now=SLOT + 2 * HOUR))
    assert enabled.enabled_at == SLOT + MINUTE  # already enabled: nothing changes
    (state,) = engine.periodic_list()
    assert (state.last_slot, state.job_id, state.settled) == (SLOT + HOUR, job.id, SLOT + HOUR)


def test_periodic_run_now__of_a_due_slot_is_that_slots_job_and_the_leader_inserts_none(
    engine: BaseEngine,
) -> None:
    result = run_now(engine, SLOT)
    assert (result.slot, result.inserted) == (SLOT, True)
    assert leader_insert(engine) == (None, False)
    assert [j.id for j in deliveries(engine, "tests.periodic")] == [result.job.id]


def test_periodic_run_now__after_the_leader_inserted_the_slot_returns_its_job(
    engine: BaseEngine,
) -> None:
    job, _ = leader_insert(engine)
    assert job is not None
    result = run_now(engine, SLOT)
    assert (result.job.id, result.slot, result.inserted) == (job.id, SLOT, False)
    assert len(deliveries(engine, "tests.periodic")) == 1


def test_periodic_run_now__without_a_due_slot_inserts_one_extra_run_while_it_waits(
    engine: BaseEngine,
) -> None:
    leader_insert(engine)
    first = run_now(engine, None)
    second = run_now(engine, None)
    assert (first.slot, first.inserted) == (None, True)
    assert (second.job.id, second.inserted) == (first.job.id, False)
    assert len(deliveries(engine, "tests.periodic")) == 2
    assert engine.periodic_last_slots() == {"p": SLOT}  # the schedule is untouched


def test_periodic_run_now__of_a_job_disabled_meanwhile_is_an_extra_run(
    engine: BaseEngine,
) -> None:
    engine.periodic_disable(PeriodicDisableParams(name="p", now=SLOT))
    result = run_now(engine, SLOT)
    assert (result.slot, result.inserted) == (None, True)
    assert result.job.unique_key == "run-now:p"
    (state,) = engine.periodic_list()
    assert (state.last_slot, state.disabled_at) == (None, SLOT)


def test_stream_consumer_lag__counts_a_late_commit_once_it_commits(tx_engine: BaseEngine) -> None:
    if not tx_engine.features.supports_xid_streams:
        pytest.skip("with one writer, seq order is commit order: no commit can be late")
    consumer(tx_engine)

    def lag() -> int:
        (row,) = tx_engine.stream_consumer_lag(StreamConsumerLagParams())
        return row.events

    with open_transaction_appending(tx_engine, "t.late") as commit_late:
        append(tx_engine, "t.early")
        assert lag() == 1  # what a pump would deliver now
        assert tx_engine.stream_pump("c", 100).delivered == 1
        assert lag() == 0
        commit_late.set()
    assert lag() == 1
    assert tx_engine.stream_pump("c", 100).delivered == 1
    assert lag() == 0
