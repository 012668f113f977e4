"""The pub/sub and streams API end to end: publish or append, then a worker runs the
subscriber job with the message; the leader's services pump and prune streams."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from django.db import transaction

import django_hopper
from django_hopper import pubsub, streams
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from django_hopper.engine.topics import UNDECODABLE_EVENT_KIND
from django_hopper.exceptions import InvalidJob, NotFound
from django_hopper.maintenance import StreamPruner, StreamPumper, default_services
from django_hopper.models import StreamEvent as StreamEventModel
from django_hopper.types import StreamPosition
from tests.support.runtime import get
from tests.testapp import jobs


@pytest.fixture(autouse=True)
def clean_declarations() -> Iterator[None]:
    """Keep each test's declared subscriptions and consumers to itself."""
    yield
    pubsub.declared.clear()
    streams.declared.clear()


def test_publish__the_worker_runs_the_subscriber_with_the_message(
    tx_engine: BaseEngine, make_worker
) -> None:
    django_hopper.subscribe("echo", "orders.*", jobs.on_message, save=True)

    with transaction.atomic():
        (handle,) = django_hopper.publish("orders.created", {"id": 7}, headers={"trace": "t-1"})

    assert make_worker().run_once() == 1
    row = get(tx_engine, handle.job)
    assert row.state == "completed"
    assert row.output == {
        "topic": "orders.created",
        "payload": {"id": 7},
        "headers": {"trace": "t-1"},
        "message_id": handle.job.metadata["message_id"],
    }


def test_publish__rolls_back_with_the_callers_transaction(tx_engine: BaseEngine) -> None:
    django_hopper.subscribe("echo", "orders.*", jobs.on_message, save=True)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        assert len(django_hopper.publish("orders.created", 1)) == 1
        raise Abort

    assert tx_engine.job_list(JobListParams(kinds=(jobs.on_message.kind,))) == []


def test_publish__a_dedup_key_returns_the_live_delivery_as_a_duplicate(engine: BaseEngine) -> None:
    django_hopper.subscribe("echo", "orders.*", jobs.on_message, save=True)

    (first,) = django_hopper.publish("orders.paid", 1, dedup_key="order-7")
    (again,) = django_hopper.publish("orders.paid", 2, dedup_key="order-7")

    assert again.duplicate and again.id == first.id


def test_subscribe__is_recorded_when_a_worker_starts(tx_engine: BaseEngine, make_worker) -> None:
    django_hopper.subscribe("declared", "users.#", jobs.on_message, queue="users")
    assert pubsub.list_subscriptions() == []

    make_worker(queues={"users": 1})

    (row,) = pubsub.list_subscriptions()
    assert (row.name, row.pattern, row.kind, row.queue) == (
        "declared",
        "users.#",
        jobs.on_message.kind,
        "users",
    )


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: django_hopper.subscribe("s", "a..b", jobs.on_message), "pattern"),
        (lambda: django_hopper.subscribe("s", "a.*", object()), "job_fn"),
        (lambda: django_hopper.subscribe("", "a.*", jobs.on_message), "name"),
        (lambda: django_hopper.publish("", 1), "topic"),
        (lambda: django_hopper.publish("a.b", object()), "payload"),
        (lambda: django_hopper.publish("a.b", 1, delay="soon"), "delay"),
        (lambda: django_hopper.append("a.#", 1), "topic"),
        (lambda: django_hopper.read("a.b", limit=-1), "limit"),
        (lambda: django_hopper.consume("c", "a.*", jobs.on_message, start="now"), "start"),
    ],
)
def test_api__refuses_bad_input_naming_the_field(engine: BaseEngine, call, field: str) -> None:
    with pytest.raises(InvalidJob) as exc:
        call()
    assert exc.value.field == field


def test_seek__an_unknown_consumer_is_refused(engine: BaseEngine) -> None:
    with pytest.raises(NotFound, match="nobody"):
        django_hopper.seek("nobody", latest=True)


def test_append__the_leader_pumps_and_the_worker_runs_the_consumer(
    tx_engine: BaseEngine, make_worker
) -> None:
    django_hopper.consume("echo", "orders.#", jobs.on_message, start="earliest", save=True)
    with transaction.atomic():
        event = django_hopper.append("orders.created", {"id": 1}, key="order-1")

    assert StreamPumper(tx_engine).run_once() == 1
    assert make_worker().run_once() == 1

    (job,) = tx_engine.job_list(JobListParams(kinds=(jobs.on_message.kind,)))
    assert job.state == "completed"
    assert job.ordering_key == "order-1"
    assert job.output["payload"] == {"id": 1}
    assert job.output["position"] == {"xid": event.position.xid, "seq": event.position.seq}
    assert streams.list_consumers()[0].delivered_at is not None


def test_stream_pumper__an_event_that_does_not_decode_fails_alone_in_a_worker_process(
    tx_engine: BaseEngine, processes
) -> None:
    for name in ("first", "second"):
        django_hopper.consume(name, "orders.#", jobs.on_message, start="earliest", save=True)
    django_hopper.append("orders.one", 1)
    bad = django_hopper.append("orders.two", 2, headers={"h": "v"})
    django_hopper.append("orders.three", 3)
    StreamEventModel.objects.filter(seq=bad.position.seq).update(headers=["h", "v"])

    assert StreamPumper(tx_engine).run_once() == 6
    proc = processes.start("--burst", "--no-maintenance", "--queues", "default:2")
    assert proc.wait(60) == 0, processes.logs()

    done = tx_engine.job_list(JobListParams(kinds=(jobs.on_message.kind,)))
    assert sorted((j.metadata["consumer"], j.output["payload"]) for j in done) == [
        ("first", 1),
        ("first", 3),
        ("second", 1),
        ("second", 3),
    ]
    assert {j.state for j in done} == {"completed"}
    failed = tx_engine.job_list(JobListParams(kinds=(UNDECODABLE_EVENT_KIND,)))
    assert sorted(j.metadata["consumer"] for j in failed) == ["first", "second"]
    for j in failed:
        assert j.state == "discarded"
        assert "does not decode" in j.errors[-1].error
        assert "headers: must be an object of strings" in j.errors[-1].error


def test_stream_pumper__a_consumer_whose_pump_raises_does_not_stop_the_others(
    tx_engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tx_engine
    for name in ("a-broken", "b-fine"):
        django_hopper.consume(name, "#", jobs.on_message, start="earliest", save=True)
    django_hopper.append("t.one", 1)
    real_pump = engine.stream_pump  # type: ignore[attr-defined]

    def pump(name: str, limit: int, now: dt.datetime | None = None) -> object:
        if name == "a-broken":
            raise ValueError("not a hopper error")
        return real_pump(name, limit, now)

    monkeypatch.setattr(engine, "stream_pump", pump)

    assert StreamPumper(engine).run_once() == 1
    assert [c.name for c in streams.list_consumers() if c.delivered_at] == ["b-fine"]


def test_read_and_seek__browse_the_log_and_replay_a_consumer(tx_engine: BaseEngine) -> None:
    django_hopper.consume("echo", "#", jobs.on_message, save=True)
    first = django_hopper.append("a.one", 1)
    django_hopper.append("a.two", 2)
    assert streams.pump("echo").delivered == 2

    assert [e.payload for e in django_hopper.read("a.*")] == [1, 2]
    assert [e.payload for e in django_hopper.read("a.*", after=first.position)] == [2]
    django_hopper.seek("echo", position=StreamPosition())
    assert streams.pump("echo").delivered == 2


def test_stream_retention__prunes_events_past_the_setting(engine: BaseEngine) -> None:
    now = engine.now()
    django_hopper.append("a.b", 1)

    assert StreamPruner(engine, retention=60).run_once(now + dt.timedelta(hours=1)) == 1
    assert StreamPruner(engine, retention=0).run_once() == 0


def test_default_services__pump_and_prune_streams(engine: BaseEngine) -> None:
    names = [s.name for s in default_services(engine)]

    assert "stream_pump" in names
    assert "stream_retention" in names
