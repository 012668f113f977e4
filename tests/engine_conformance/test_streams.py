"""Streams: the event log, consumers, seeks and pumps (both engines).

Pumps run on committed data (``tx_engine``): what a pump may deliver depends
on which transactions have committed, which a test's own open transaction
would blur.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobListParams,
    StreamAppendParams,
    StreamPruneParams,
    StreamReadParams,
    StreamSeekParams,
)
from django_hopper.engine.topics import UNDECODABLE_EVENT_KIND
from django_hopper.exceptions import InvalidJob, NotFound
from django_hopper.models import StreamEvent as StreamEventModel
from django_hopper.types import JobRow, StreamConsumerRow, StreamEvent, StreamPosition, StreamStart
from tests.engine_conformance.support import HOUR, MINUTE

KIND = "tests.stream_consumer"


def streams(engine: BaseEngine) -> BaseEngine:
    return engine


def append(
    engine: BaseEngine,
    topic: str,
    payload: object = None,
    now: dt.datetime | None = None,
    **fields: object,
) -> StreamEvent:
    return streams(engine).stream_append(
        StreamAppendParams(topic=topic, payload=payload, now=now, **fields)  # type: ignore[arg-type]
    )


def consumer(
    engine: BaseEngine,
    name: str = "c",
    pattern: str = "#",
    start: str = StreamStart.EARLIEST,
    **fields: object,
) -> None:
    streams(engine).stream_consumer_upsert(
        [StreamConsumerRow(name=name, pattern=pattern, kind=KIND, start=start, **fields)]  # type: ignore[arg-type]
    )


def get_consumer(engine: BaseEngine, name: str = "c") -> StreamConsumerRow:
    (row,) = [c for c in streams(engine).stream_consumer_list() if c.name == name]
    return row


def deliveries(engine: BaseEngine) -> list[JobRow]:
    return engine.job_list(JobListParams(kinds=(KIND,), limit=1000))


def delivered_topics(engine: BaseEngine) -> list[str]:
    return [j.args["args"][0]["topic"] for j in deliveries(engine)]


def pump(engine: BaseEngine, name: str = "c", limit: int = 100) -> int:
    return streams(engine).stream_pump(name, limit).delivered


# -- append and read ------------------------------------------------------------


def test_stream_append__returns_the_event_at_a_growing_position(engine: BaseEngine) -> None:
    first = append(engine, "orders.created", {"id": 1}, key="o-1", headers={"h": "v"})
    second = append(engine, "orders.paid", [1, 2])

    assert second.position > first.position
    assert first.key == "o-1"
    assert first.headers == {"h": "v"}
    assert first.message_id and first.message_id != second.message_id
    if engine.features.supports_xid_streams:
        assert first.position.xid > 0
    else:
        assert first.position.xid == 0


def test_stream_append__refuses_bad_input_naming_the_field(engine: BaseEngine) -> None:
    for fields, field in [
        ({"topic": ""}, "topic"),
        ({"topic": "a.*"}, "topic"),
        ({"topic": "a", "payload": {"x": {1, 2}}}, "payload"),
        ({"topic": "a", "key": ""}, "key"),
        ({"topic": "a", "headers": {"h": 2}}, "headers"),
    ]:
        with pytest.raises(InvalidJob) as exc:
            streams(engine).stream_append(StreamAppendParams(**fields))  # type: ignore[arg-type]
        assert (exc.value.field or "").startswith(field)


def test_stream_read__pages_matching_events_after_a_position_in_order(
    engine: BaseEngine,
) -> None:
    a = append(engine, "orders.created", {"n": 1})
    append(engine, "users.created", {"n": 2})
    c = append(engine, "orders.paid", {"n": 3})
    d = append(engine, "orders.paid", {"n": 4})

    page = streams(engine).stream_read(StreamReadParams(pattern="orders.*", limit=2))
    rest = streams(engine).stream_read(
        StreamReadParams(pattern="orders.*", after=page[-1].position, limit=10)
    )

    assert [e.payload for e in page] == [{"n": 1}, {"n": 3}]
    assert [e.position for e in page] == [a.position, c.position]
    assert [e.position for e in rest] == [d.position]
    everything = streams(engine).stream_read(StreamReadParams(pattern="", limit=10))
    assert len(everything) == 4
    assert everything[0].created_at is not None


def test_stream_read__refuses_a_negative_limit_and_a_bad_pattern(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob) as exc:
        streams(engine).stream_read(StreamReadParams(limit=-1))
    assert exc.value.field == "limit"
    with pytest.raises(InvalidJob) as exc:
        streams(engine).stream_read(StreamReadParams(pattern="a..b"))
    assert exc.value.field == "pattern"


# -- consumers --------------------------------------------------------------------


def test_stream_consumer_upsert__updates_settings_and_keeps_the_position(
    tx_engine: BaseEngine,
) -> None:
    append(tx_engine, "a.b")
    consumer(tx_engine, pattern="a.*", queue="q1")
    assert pump(tx_engine) == 1
    position = get_consumer(tx_engine).position

    consumer(
        tx_engine,
        pattern="b.#",
        queue="q2",
        max_attempts=4,
        metadata={"m": 1},
        start=StreamStart.EARLIEST,
    )

    row = get_consumer(tx_engine)
    assert (row.pattern, row.queue, row.max_attempts, row.metadata) == ("b.#", "q2", 4, {"m": 1})
    assert row.position == position
    assert pump(tx_engine) == 0  # not restarted from the earliest


def test_stream_consumer_upsert__latest_starts_past_the_events_appended_so_far(
    tx_engine: BaseEngine,
) -> None:
    append(tx_engine, "old.event")
    consumer(tx_engine, name="late", start=StreamStart.LATEST)
    consumer(tx_engine, name="early", start=StreamStart.EARLIEST)
    append(tx_engine, "new.event")

    assert pump(tx_engine, "late") == 1
    assert pump(tx_engine, "early") == 2
    assert sorted(delivered_topics(tx_engine)) == ["new.event", "new.event", "old.event"]


def test_stream_consumer_upsert__refuses_an_unknown_start(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob) as exc:
        consumer(engine, start="middle")
    assert exc.value.field == "start"


def test_stream_consumer_list__returns_every_consumer_by_name(engine: BaseEngine) -> None:
    consumer(engine, name="b")
    consumer(engine, name="a", pattern="x.*", start=StreamStart.LATEST)

    rows = streams(engine).stream_consumer_list()

    assert [(r.name, r.pattern, r.start) for r in rows] == [
        ("a", "x.*", "latest"),
        ("b", "#", "earliest"),
    ]
    assert all(r.created_at is not None and r.delivered_at is None for r in rows)


# -- pump -------------------------------------------------------------------------------


def test_stream_pump__turns_matching_events_into_deliveries_of_the_consumer(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine, pattern="orders.#", queue="orders", metadata={"team": "t"})
    e1 = append(tx_engine, "orders.created", {"id": 1}, key="o-1", headers={"h": "1"})
    append(tx_engine, "users.created", {"id": 2})
    append(tx_engine, "orders.paid", {"id": 1})

    result = streams(tx_engine).stream_pump("c", 100)

    assert result.delivered == 2
    assert result.queues == ["orders"]
    first, second = sorted(
        deliveries(tx_engine), key=lambda j: j.args["args"][0]["position"]["seq"]
    )
    assert first.queue == "orders"
    assert first.ordering_key == "o-1"
    assert first.max_attempts == 10  # keyed default
    assert second.ordering_key is None
    assert second.max_attempts == 25
    message = first.args["args"][0]
    assert message == {
        "topic": "orders.created",
        "payload": {"id": 1},
        "headers": {"h": "1"},
        "message_id": e1.message_id,
        "key": "o-1",
        "position": {"xid": e1.position.xid, "seq": e1.position.seq},
    }
    assert first.metadata == {
        "team": "t",
        "topic": "orders.created",
        "message_id": e1.message_id,
        "headers": {"h": "1"},
        "consumer": "c",
    }
    assert get_consumer(tx_engine).delivered_at is not None
    assert streams(tx_engine).stream_pump("c", 100).delivered == 0


def test_stream_pump__delivers_at_most_limit_and_continues_where_it_stopped(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine)
    for i in range(5):
        append(tx_engine, f"t.n{i}")

    assert [pump(tx_engine, limit=2) for _ in range(4)] == [2, 2, 1, 0]
    assert delivered_topics(tx_engine) == [f"t.n{i}" for i in range(5)]


def test_stream_pump__limit_counts_events_of_one_transaction_in_part(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine)
    with transaction.atomic():
        for i in range(3):
            append(tx_engine, f"t.n{i}")
    append(tx_engine, "t.n3")

    assert [pump(tx_engine, limit=2) for _ in range(3)] == [2, 2, 0]
    assert delivered_topics(tx_engine) == [f"t.n{i}" for i in range(4)]


def test_stream_pump__limit_zero_delivers_nothing(tx_engine: BaseEngine) -> None:
    consumer(tx_engine)
    append(tx_engine, "t.a")

    assert pump(tx_engine, limit=0) == 0
    assert pump(tx_engine) == 1


def test_stream_pump__an_unknown_consumer_or_a_negative_limit_is_refused(
    tx_engine: BaseEngine,
) -> None:
    with pytest.raises(NotFound):
        streams(tx_engine).stream_pump("nobody", 10)
    consumer(tx_engine)
    with pytest.raises(InvalidJob) as exc:
        streams(tx_engine).stream_pump("c", -1)
    assert exc.value.field == "limit"


def test_stream_pump__an_event_appended_in_the_pumping_transaction_waits_for_its_commit(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine)
    with transaction.atomic():
        append(tx_engine, "t.mine")
        first = pump(tx_engine)
    after = pump(tx_engine)

    assert first + after == 1  # delivered exactly once, never skipped


@contextmanager
def open_transaction_appending(
    engine: BaseEngine, topic: str, now: dt.datetime | None = None
) -> Iterator[threading.Event]:
    """Append ``topic`` in another connection's transaction, held open until the
    yielded event is set; it then commits."""
    appended = threading.Event()
    commit = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with transaction.atomic():
                append(engine, topic, now=now)
                appended.set()
                commit.wait(10)
        except BaseException as exc:
            errors.append(exc)
            appended.set()
        finally:
            connection.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert appended.wait(10), "the appending transaction did not start"
    assert not errors, errors
    try:
        yield commit
    finally:
        commit.set()
        thread.join(10)
    assert not errors, errors


def test_stream_pump__never_skips_an_event_whose_transaction_commits_late(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_xid_streams:
        pytest.skip("with one writer, seq order is commit order: no commit can be late")
    consumer(tx_engine)

    with open_transaction_appending(tx_engine, "t.late") as commit_late:
        early = append(tx_engine, "t.early")  # appended after, committed first
        assert pump(tx_engine) == 1
        assert delivered_topics(tx_engine) == ["t.early"]
        commit_late.set()
    assert early.position.seq > 0

    assert pump(tx_engine) == 1
    assert sorted(delivered_topics(tx_engine)) == ["t.early", "t.late"]
    assert pump(tx_engine) == 0


def test_stream_pump__a_late_commit_behind_a_partial_delta_is_not_skipped(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_xid_streams:
        pytest.skip("with one writer, seq order is commit order: no commit can be late")
    consumer(tx_engine)

    with open_transaction_appending(tx_engine, "t.late") as commit_late:
        for i in range(3):
            append(tx_engine, f"t.n{i}")
        assert pump(tx_engine, limit=2) == 2  # the delta is read in part
        commit_late.set()

    assert pump(tx_engine, limit=10) == 2
    assert sorted(delivered_topics(tx_engine)) == ["t.late", "t.n0", "t.n1", "t.n2"]


def test_stream_pump__a_late_commit_behind_a_backlog_pumped_in_parts_is_delivered_once(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_xid_streams:
        pytest.skip("with one writer, seq order is commit order: no commit can be late")
    consumer(tx_engine)

    with open_transaction_appending(tx_engine, "t.a") as commit_a:
        append(tx_engine, "t.b")
        append(tx_engine, "t.c")
        assert pump(tx_engine, limit=1) == 1
        assert pump(tx_engine, limit=1) == 1
        commit_a.set()
    counts = [pump(tx_engine, limit=1) for _ in range(3)]

    assert counts == [1, 0, 0]
    assert delivered_topics(tx_engine) == ["t.b", "t.c", "t.a"]


def test_stream_pump__a_transaction_delivered_in_part_finishes_before_a_late_commit(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_xid_streams:
        pytest.skip("with one writer, seq order is commit order: no commit can be late")
    consumer(tx_engine)

    with open_transaction_appending(tx_engine, "t.late") as commit_late:
        with transaction.atomic():
            for i in range(3):
                append(tx_engine, f"t.n{i}")
        assert pump(tx_engine, limit=2) == 2  # inside the transaction of n0..n2
        commit_late.set()
    assert pump(tx_engine, limit=2) == 2  # the rest of it, then the late one
    assert pump(tx_engine, limit=2) == 0

    assert delivered_topics(tx_engine) == ["t.n0", "t.n1", "t.n2", "t.late"]


def test_stream_pump__two_pumps_of_one_consumer_deliver_each_event_once(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine)
    for i in range(20):
        append(tx_engine, f"t.n{i}")
    barrier = threading.Barrier(2)
    counts: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait(10)
            for _ in range(10):
                counts.append(pump(tx_engine, limit=3))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert not errors, errors
    assert sum(counts) == 20
    assert sorted(delivered_topics(tx_engine)) == sorted(f"t.n{i}" for i in range(20))


def test_stream_pump__an_event_that_does_not_decode_is_delivered_as_a_failure_alone(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine, "first", "t.#")
    consumer(tx_engine, "second", "t.#")
    append(tx_engine, "t.before", 1)
    bad = append(tx_engine, "t.bad", 2, key="k-1", headers={"h": "v"})
    append(tx_engine, "t.after", 3)
    StreamEventModel.objects.filter(seq=bad.position.seq).update(headers=["not", "an", "object"])

    assert [pump(tx_engine, name) for name in ("first", "second")] == [3, 3]

    rows = deliveries(tx_engine) + tx_engine.job_list(
        JobListParams(kinds=(UNDECODABLE_EVENT_KIND,), limit=100)
    )
    by_consumer: dict[str, list[JobRow]] = {}
    for row in sorted(rows, key=lambda r: r.id):
        by_consumer.setdefault(row.metadata["consumer"], []).append(row)
    for name in ("first", "second"):
        before, failed, after = by_consumer[name]
        assert before.args["args"][0]["topic"] == "t.before"
        assert after.args["args"][0]["topic"] == "t.after"
        assert failed.kind == UNDECODABLE_EVENT_KIND
        assert failed.max_attempts == 1
        assert failed.ordering_key == "k-1"
        assert failed.metadata["consumer_kind"] == KIND
        assert failed.metadata["decode_error"].startswith("headers: must be an object of strings")
        assert failed.args["kwargs"]["topic"] == "t.bad"


def test_stream_read__an_event_that_does_not_decode_reads_back_saying_why(
    engine: BaseEngine,
) -> None:
    bad = append(engine, "t.bad", {"x": 1}, headers={"h": "v"})
    good = append(engine, "t.good")
    StreamEventModel.objects.filter(seq=bad.position.seq).update(headers={"h": 7})

    first, second = streams(engine).stream_read(StreamReadParams(limit=10))

    assert first.headers == {}
    assert first.payload == {"x": 1}  # the columns that decode are kept
    assert first.decode_error is not None and "headers" in first.decode_error
    assert second.position == good.position
    assert second.decode_error is None


# -- seek --------------------------------------------------------------------------------


def test_stream_consumer_seek__earliest_delivers_every_event_again(tx_engine: BaseEngine) -> None:
    consumer(tx_engine)
    append(tx_engine, "t.a")
    append(tx_engine, "t.b")
    assert pump(tx_engine) == 2

    streams(tx_engine).stream_consumer_seek("c", StreamSeekParams(earliest=True))

    assert pump(tx_engine) == 2


def test_stream_consumer_seek__latest_skips_the_events_appended_so_far(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine)
    append(tx_engine, "t.a")

    streams(tx_engine).stream_consumer_seek("c", StreamSeekParams(latest=True))
    append(tx_engine, "t.b")

    assert pump(tx_engine) == 1
    assert delivered_topics(tx_engine) == ["t.b"]


def test_stream_consumer_seek__position_delivers_the_events_after_it(
    tx_engine: BaseEngine,
) -> None:
    consumer(tx_engine)
    events = [append(tx_engine, f"t.n{i}") for i in range(4)]
    assert pump(tx_engine) == 4

    row = streams(tx_engine).stream_consumer_seek(
        "c", StreamSeekParams(position=events[1].position)
    )

    assert row.name == "c"
    assert pump(tx_engine) == 2
    assert delivered_topics(tx_engine)[-2:] == ["t.n2", "t.n3"]


def test_stream_consumer_seek__time_moves_before_the_first_event_at_or_after_it(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    consumer(tx_engine)
    append(tx_engine, "t.old", now=now - HOUR)
    append(tx_engine, "t.new1", now=now)
    append(tx_engine, "t.new2", now=now + MINUTE)
    assert pump(tx_engine) == 3

    streams(tx_engine).stream_consumer_seek("c", StreamSeekParams(time=now))
    assert pump(tx_engine) == 2
    streams(tx_engine).stream_consumer_seek("c", StreamSeekParams(time=now + HOUR))
    assert pump(tx_engine) == 0


def test_stream_consumer_seek__time_keeps_a_transaction_open_at_the_seek_unread(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_xid_streams:
        pytest.skip("with one writer no transaction can be open at a seek")
    now = tx_engine.now()
    consumer(tx_engine)
    append(tx_engine, "t.old", now=now - HOUR)

    with open_transaction_appending(tx_engine, "t.open", now=now + MINUTE) as commit_open:
        append(tx_engine, "t.new", now=now)
        streams(tx_engine).stream_consumer_seek("c", StreamSeekParams(time=now))
        commit_open.set()

    assert pump(tx_engine) == 2
    assert sorted(delivered_topics(tx_engine)) == ["t.new", "t.open"]


def test_stream_consumer_seek__position_keeps_a_transaction_open_at_the_seek_unread(
    tx_engine: BaseEngine,
) -> None:
    if not tx_engine.features.supports_xid_streams:
        pytest.skip("with one writer no transaction can be open at a seek")
    consumer(tx_engine)

    with open_transaction_appending(tx_engine, "t.open") as commit_open:
        first = append(tx_engine, "t.first")
        append(tx_engine, "t.second")
        streams(tx_engine).stream_consumer_seek("c", StreamSeekParams(position=first.position))
        commit_open.set()

    assert pump(tx_engine) == 2
    assert sorted(delivered_topics(tx_engine)) == ["t.open", "t.second"]


def test_stream_consumer_seek__refuses_none_or_several_targets_and_unknown_consumers(
    engine: BaseEngine,
) -> None:
    consumer(engine)
    with pytest.raises(InvalidJob):
        streams(engine).stream_consumer_seek("c", StreamSeekParams())
    with pytest.raises(InvalidJob):
        streams(engine).stream_consumer_seek("c", StreamSeekParams(earliest=True, latest=True))
    with pytest.raises(NotFound):
        streams(engine).stream_consumer_seek("nobody", StreamSeekParams(latest=True))


# -- retention ------------------------------------------------------------------------


def test_stream_prune__deletes_events_older_than_the_retention(engine: BaseEngine) -> None:
    now = engine.now()
    append(engine, "t.old", now=now - 2 * HOUR)
    append(engine, "t.older", now=now - 3 * HOUR)
    append(engine, "t.new", now=now)

    pruned = streams(engine).stream_prune(StreamPruneParams(retention=HOUR, now=now))

    assert pruned == 2
    left = streams(engine).stream_read(StreamReadParams(limit=10))
    assert [e.topic for e in left] == ["t.new"]
    assert streams(engine).stream_prune(StreamPruneParams(retention=HOUR, now=now)) == 0


def test_stream_position__orders_by_xid_then_seq() -> None:
    assert StreamPosition(1, 9) < StreamPosition(2, 1)
    assert not StreamPosition()
    assert StreamPosition(0, 1)
