"""Streams: a durable, ordered event log that consumers turn into jobs.

Unlike a publish, which fans out to the subscriptions that exist at that
moment, an append is kept (for ``HOPPER["STREAM_RETENTION"]``) and read by
consumers at their own pace; a new consumer can start at the earliest event,
and any consumer can seek back and read again::

    @job
    def project_order(message: Message) -> None: ...

    consume("orders-projection", "orders.#", project_order, start="earliest")

    with transaction.atomic():
        order = Order.objects.create(...)
        append("orders.created", {"order_id": order.pk}, key=f"order-{order.pk}")

The leader's ``StreamPumper`` service pumps every consumer each maintenance
interval: it turns the events after the consumer's position into delivery
jobs (the event's key becomes their ordering key) and advances the position,
atomically. On PostgreSQL positions come from transaction ids, so an event
whose transaction commits late is still delivered (docs/pubsub-and-streams.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_hopper.engine import get_engine, topics
from django_hopper.engine.params import (
    RouteDeleteResult,
    StreamAppendParams,
    StreamConsumerDeleteParams,
    StreamConsumerLagParams,
    StreamConsumerPauseParams,
    StreamConsumerResetParams,
    StreamConsumerResumeParams,
    StreamPumpResult,
    StreamReadParams,
    StreamSeekParams,
)
from django_hopper.engine.topics import Message
from django_hopper.exceptions import HopperError, InvalidJob, NotFound
from django_hopper.jobs import job
from django_hopper.pubsub import announce_ended, kind_and_queue, sync_subscriptions
from django_hopper.types import (
    StreamConsumerLag,
    StreamConsumerRow,
    StreamEvent,
    StreamPosition,
    StreamStart,
)
from django_hopper.worker import wakeups

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine

__all__ = [
    "Consumer",
    "Message",
    "StreamEvent",
    "StreamPosition",
    "UndecodableEvent",
    "append",
    "consume",
    "consumer_lag",
    "delete_consumer",
    "list_consumers",
    "pause_consumer",
    "pump",
    "read",
    "reset_consumer",
    "resume_consumer",
    "seek",
    "sync_consumers",
    "sync_declared",
]

#: Consumers declared in code, by name; upserted by sync_consumers().
declared: dict[str, Consumer] = {}
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True, slots=True)
class Consumer:
    """A stream consumer as declared in code."""

    name: str
    pattern: str
    kind: str
    queue: str
    start: str = StreamStart.LATEST
    #: 0: the default (25, or 10 for events with a key).
    max_attempts: int = 0
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def row(self) -> StreamConsumerRow:
        """Return the engine row this declaration upserts."""
        return StreamConsumerRow(
            name=self.name,
            pattern=self.pattern,
            kind=self.kind,
            queue=self.queue,
            start=self.start,
            max_attempts=self.max_attempts,
            metadata=dict(self.metadata),
        )


def _engine() -> BaseEngine:

    return get_engine()


def append(
    topic: str,
    payload: Any = None,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> StreamEvent:
    """Append an event in the caller's transaction; the leader is signalled at commit.

    ``key`` orders the event's deliveries: those of one key run one at a time,
    in position order, per consumer queue. On PostgreSQL the signal is a
    notification every worker hears; without notifications (SQLite) only a
    leader in this process is woken, and the others' round pumps it.
    """

    engine = _engine()
    event = engine.stream_append(
        StreamAppendParams(
            topic=topic,
            payload=payload,
            key=key,
            headers=topics.check_headers(headers),
            notify=True,
        )
    )
    if not engine.features.supports_listen:
        transaction.on_commit(lambda: wakeups.stream_appended(event.topic), using=engine.alias)
    return event


def read(
    pattern: str = "", after: StreamPosition | None = None, limit: int = 100
) -> list[StreamEvent]:
    """Page through committed events after ``after`` whose topic matches, in position
    order: for browsing and tools. A consumer, not a loop over ``read``, is what
    never misses an event whose transaction commits late."""

    return _engine().stream_read(
        StreamReadParams(pattern=pattern, after=after or StreamPosition(), limit=limit)
    )


def consume(
    name: str,
    pattern: str,
    job_fn: Any,
    *,
    start: str = StreamStart.LATEST,
    queue: str | None = None,
    max_attempts: int = 0,
    metadata: Mapping[str, Any] | None = None,
    save: bool = False,
) -> Consumer:
    """Declare a consumer: events whose topic matches ``pattern`` run ``job_fn``.

    A new consumer starts at ``start`` ("latest": past every event appended so
    far; "earliest": before every retained one); an existing one keeps its
    position whatever ``start`` says. Recorded when a worker starts, or now
    with ``save=True``.
    """
    if start not in StreamStart.values():
        raise InvalidJob(
            f"start must be one of {', '.join(StreamStart.values())}, not {start!r}", field="start"
        )
    kind, q = kind_and_queue(job_fn, queue)
    consumer = Consumer(
        name=topics.check_name(name),
        pattern=topics.check_pattern(pattern),
        kind=kind,
        queue=q,
        start=start,
        max_attempts=topics.check_max_attempts(max_attempts),
        metadata=topics.check_metadata(dict(metadata) if metadata is not None else None),
    )
    with _lock:
        declared[consumer.name] = consumer
    if save:
        sync_consumers([consumer])
    return consumer


def sync_consumers(
    consumers: list[Consumer] | None = None, engine: BaseEngine | None = None
) -> int:
    """Upsert consumers (default: every declared one); return how many."""

    rows = list(declared.values()) if consumers is None else consumers
    if rows:
        (engine or get_engine()).stream_consumer_upsert([c.row() for c in rows])
    return len(rows)


def sync_declared(engine: BaseEngine | None = None) -> int:
    """Upsert every subscription and consumer declared in code (a worker's start)."""

    return sync_subscriptions(engine=engine) + sync_consumers(engine=engine)


def list_consumers() -> list[StreamConsumerRow]:
    """Return every consumer with its position, by name."""
    return _engine().stream_consumer_list()


def seek(
    name: str,
    *,
    position: StreamPosition | None = None,
    time: dt.datetime | None = None,
    earliest: bool = False,
    latest: bool = False,
) -> StreamConsumerRow:
    """Move a consumer (exactly one target): the events after the new position are
    delivered, again if they were before. Raises NotFound for an unknown consumer."""

    params = StreamSeekParams(position=position, time=time, earliest=earliest, latest=latest)
    try:
        return _engine().stream_consumer_seek(name, params)
    except NotFound:
        raise NotFound(f"no stream consumer is named {name!r}; declare it with consume()") from None


def pump(name: str, limit: int = 1000) -> StreamPumpResult:
    """Deliver up to ``limit`` of a consumer's pending events now (the leader does
    this every maintenance interval)."""
    return _engine().stream_pump(name, limit)


def pause_consumer(name: str) -> StreamConsumerRow:
    """Stop delivering a consumer's events: they wait in the log at its position
    (retention still applies) until :func:`resume_consumer`. Stored, so a worker
    re-declaring the consumer keeps it paused. Raises NotFound."""
    return _engine().stream_consumer_pause(StreamConsumerPauseParams(name=name))


def resume_consumer(name: str) -> StreamConsumerRow:
    """Deliver a paused consumer's events again, from where it stopped. Raises NotFound."""
    return _engine().stream_consumer_resume(StreamConsumerResumeParams(name=name))


def reset_consumer(name: str) -> StreamConsumerRow:
    """Move a consumer back to its ``start`` as if it were created now: ``earliest``
    replays every retained event, ``latest`` skips the backlog. Raises NotFound."""
    return _engine().stream_consumer_reset(StreamConsumerResetParams(name=name))


def delete_consumer(name: str, *, cancel_pending: bool = False) -> RouteDeleteResult:
    """Delete a consumer and its position; the log keeps its events for the others.

    Deliveries already made still run, unless ``cancel_pending``: then those
    not running are canceled in the same transaction. Forgotten in this
    process's declarations too; a process whose code still declares it
    creates it again, at its ``start``, at its next worker start. Raises NotFound.
    """
    engine = _engine()
    result = engine.stream_consumer_delete(
        StreamConsumerDeleteParams(name=name, cancel_pending=cancel_pending)
    )
    with _lock:
        declared.pop(name, None)
    announce_ended(result, engine.alias)
    return result


def consumer_lag(names: list[str] | None = None, limit: int = 1000) -> list[StreamConsumerLag]:
    """Return how far behind each consumer (default: all) is, by name.

    Each reads the consumer's next ``limit`` waiting events (what a pump would
    read, whatever their topic) and counts those its pattern matches, with when
    the first of them was appended; ``capped`` says more events wait than were
    read, so the count is a floor. The cost is bounded by ``limit`` per
    consumer, never by the log's size.
    """
    wanted: Any = () if names is None else names if isinstance(names, str) else tuple(names)
    return _engine().stream_consumer_lag(StreamConsumerLagParams(names=wanted, limit=limit))


class UndecodableEvent(HopperError):
    """A stream event's stored columns do not decode, so no consumer can be given it."""


@job(kind=topics.UNDECODABLE_EVENT_KIND, max_attempts=1)
def undecodable_event(consumer: str, topic: str, position: dict[str, int], error: str) -> None:
    """Fail with why an event does not decode: the delivery a pump makes of it.

    The consumer's own function never sees such an event; this delivery puts
    the failure on record, in the consumer's queue, with the reason, and the
    consumer's later events go on.
    """
    raise UndecodableEvent(
        f"stream event {topic!r} at position ({position.get('xid')}, {position.get('seq')}) "
        f"does not decode for consumer {consumer!r}: {error}"
    )
