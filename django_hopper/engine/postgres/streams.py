"""Stream methods of the PostgreSQL engine; SQL in ``queries/streams.sql``.

Positions come from transaction ids, so that a consumer never skips an event
whose transaction commits late (docs/pubsub-and-streams.md has the whole
argument). The one piece of arithmetic done here rather than in SQL is
:func:`advance`: the snapshot a pump stores when it delivered only part of
the events it could see.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_hopper.engine import topics
from django_hopper.engine.params import (
    JobInsertOpts,
    StreamAppendParams,
    StreamConsumerDeleteParams,
    StreamConsumerPauseParams,
    StreamConsumerResumeParams,
    StreamPruneParams,
    StreamPumpResult,
    StreamReadParams,
    StreamSeekParams,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.pubsub import route_columns
from django_hopper.engine.postgres.support import PostgresSupport
from django_hopper.ids import new_id
from django_hopper.types import (
    CHANNEL_STREAM,
    JobID,
    StreamConsumerLag,
    StreamConsumerRow,
    StreamEvent,
    StreamPosition,
    StreamStart,
)

#: The snapshot in which no transaction is visible: a consumer at the earliest.
EARLIEST_SNAPSHOT = "1:1:"


@dataclass(slots=True, frozen=True)
class Snapshot:
    """A pg_snapshot: transactions below ``xmax`` and not in ``xip`` are visible."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """Parse pg_snapshot's text form ``xmin:xmax:xip1,xip2``."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def __str__(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.xip))}"

    def without(self, xid: int | None) -> Snapshot:
        """Return the snapshot with ``xid`` (a transaction not yet committed) invisible.

        PostgreSQL leaves the current transaction out of its own snapshot's
        in-progress list; a pump must not record it as read.
        """
        if xid is None or xid >= self.xmax or xid in self.xip:
            return self
        return Snapshot(min(self.xmin, xid), self.xmax, self.xip | {xid})


def advance(stored: Snapshot, current: Snapshot, xid: int, began_inside: int = 0) -> Snapshot:
    """Return the snapshot to store after delivering the delta only up to ``xid``.

    A pump delivers the rest of the transaction its stored position is inside
    (``began_inside``, 0 for none) first, then the other transactions of the
    delta (visible in ``current``, not in ``stored``) in xid order. A pump
    that stopped inside ``began_inside`` delivered nothing else: ``stored``
    stays as it is. Otherwise ``began_inside`` and the delta's transactions
    below ``xid`` were delivered whole and ``xid`` in part (the position says
    how far). The result sees what ``stored`` saw plus those, and nothing
    else: in-progress transactions (``current.xip``), the stored snapshot's
    unread ones from ``xid`` on, and ``xid`` itself stay invisible, so each is
    delivered once it commits, however late. Every xid below the result's
    xmin has finished.
    """
    if began_inside and xid == began_inside:
        return stored
    xmax = max(stored.xmax, xid + 1, began_inside + 1)
    xip = {x for x in current.xip if x < xmax}
    xip |= {x for x in stored.xip if xid <= x < xmax and x != began_inside}
    xip.add(xid)
    return Snapshot(min(xip), xmax, frozenset(xip))


def seek_snapshot(current: Snapshot, xid: int) -> Snapshot:
    """Return the snapshot of a seek to a position in transaction ``xid``: every
    transaction before it read, except those still in progress at the seek,
    which are delivered once they commit; ``xid`` and later ones unread."""
    first = max(xid, 1)
    xip = frozenset(x for x in current.xip if x < first)
    return Snapshot(min(xip, default=first), first, xip)


def event_from_row(r: Sequence[Any]) -> StreamEvent:
    """Build a StreamEvent from (seq, xid, topic, key, payload, headers, message_id,
    created_at), tolerating columns that do not decode (:func:`topics.decoded_event`)."""
    return topics.decoded_event(
        StreamPosition(xid=int(r[1]), seq=int(r[0])),
        r[2],
        r[3],
        r[6],
        payload=lambda: convert.load_json(r[4]),
        headers=lambda: convert.load_json(r[5]),
        created_at=lambda: r[7],
    )


def consumer_from_row(r: Sequence[Any]) -> StreamConsumerRow:
    """Build a StreamConsumerRow from the consumer columns the queries select."""
    return StreamConsumerRow(
        name=r[0],
        pattern=r[1],
        kind=r[2],
        queue=r[3],
        max_attempts=int(r[4]),
        metadata=convert.load_json(r[5]) or {},
        start=r[6],
        snapshot=r[7],
        position=StreamPosition(xid=int(r[8]), seq=int(r[9])),
        delivered_at=r[10],
        created_at=r[11],
        updated_at=r[12],
        paused_at=r[13],
    )


class StreamsMixin(PostgresSupport):
    """The stream log and its consumers, read through snapshots."""

    def _stream_append(self, params: StreamAppendParams) -> StreamEvent:
        """Append one event stamped with the current transaction's id."""
        message_id = params.message_id or new_id().hex
        row = self._fetchone(
            "stream_append",
            {
                "topic": params.topic,
                "key": params.key,
                "payload": convert.dump_json(params.payload, "payload"),
                "headers": convert.dump_json(dict(params.headers), "headers"),
                "message_id": message_id,
                "now": params.now,
                "notify": bool(params.notify),
                "channel": CHANNEL_STREAM,
            },
        )
        assert row is not None
        return StreamEvent(
            position=StreamPosition(xid=int(row[1]), seq=int(row[0])),
            topic=params.topic,
            key=params.key,
            payload=params.payload,
            headers=dict(params.headers),
            message_id=message_id,
            created_at=row[2],
        )

    def _stream_read(self, params: StreamReadParams) -> list[StreamEvent]:
        """Page through committed events after a position, in position order."""
        rows = self._fetchall(
            "stream_read",
            {
                "xid": params.after.xid,
                "seq": params.after.seq,
                "regex": topics.pattern_regex(params.pattern),
                "limit": params.limit,
            },
        )
        return [event_from_row(r) for r in rows]

    def _stream_consumer_upsert(
        self, rows: Sequence[StreamConsumerRow], now: dt.datetime | None = None
    ) -> None:
        """Upsert consumers in one statement; a new one starts at its snapshot."""
        checked = {r.name: r for r in rows}
        consumers = list(checked.values())
        self._execute(
            "stream_consumer_upsert",
            {
                "latest": self._latest(),
                "now": now,
                **route_columns(consumers),
                "starts": [c.start for c in consumers],
            },
        )

    def _current(self) -> Snapshot:
        """Return the snapshot of "every transaction committed so far", without the
        caller's own transaction, which has not committed yet."""
        row = self._fetchone("stream_consumer_upsert.snapshot", {})
        assert row is not None
        return Snapshot.parse(row[0]).without(row[1])

    def _latest(self) -> str:
        """Return the stored form of :meth:`_current`."""
        return str(self._current())

    def _stream_consumer_list(self) -> list[StreamConsumerRow]:
        """Return every consumer with its snapshot and position."""
        return [consumer_from_row(r) for r in self._fetchall("stream_consumer_list", {})]

    def _stream_consumer_seek(
        self, name: str, params: StreamSeekParams, mode: str
    ) -> StreamConsumerRow | None:
        """Move a consumer by storing the snapshot and position the seek implies.

        A position (x, s) becomes :func:`seek_snapshot` (every transaction
        before x read but those still in progress, none from x on) with the
        events of x up to s read; a time seeks to just before the first event
        at or after it. No seek counts as read a transaction in progress at
        the seek: it has not been seen, and is delivered once it commits. The
        snapshot is taken before the target is looked up, so that a
        transaction committing in between counts as in progress.
        """
        snapshot: str
        xid = seq = 0
        if mode == StreamStart.EARLIEST:
            snapshot = EARLIEST_SNAPSHOT
        elif mode == StreamStart.LATEST:
            snapshot = self._latest()
        else:
            current = self._current()
            target: tuple[int, int] | None
            if mode == "position":
                assert params.position is not None
                target = (params.position.xid, params.position.seq)
            else:
                row = self._fetchone("stream_consumer_seek.time", {"time": params.time})
                target = (int(row[0]), int(row[1]) - 1) if row else None
            if target is None or target[0] >= current.xmax:
                # No event at or after the time, or a transaction not begun at the seek.
                snapshot = str(current)
            else:
                xid, seq = target
                snapshot = str(seek_snapshot(current, xid))
        row = self._fetchone(
            "stream_consumer_seek", {"name": name, "snapshot": snapshot, "xid": xid, "seq": seq}
        )
        return None if row is None else consumer_from_row(row)

    def _stream_pump(
        self, name: str, limit: int, now: dt.datetime | None = None
    ) -> StreamPumpResult | None:
        """Deliver up to ``limit`` events of the consumer's delta and store how far it got.

        Locks the consumer's row first, so a second pump waits and then reads
        the snapshot this one stored. The events come with the snapshot of
        the statement that read them: delivering all of them stores that
        snapshot (position zero); delivering only ``limit`` stores
        :func:`advance`'s, with the last event's position.
        """
        with self._atomic():
            row = self._fetchone("stream_pump", {"name": name})
            if row is None:
                return None
            consumer = consumer_from_row(row)
            if topics.pump_stops(consumer, limit):
                return StreamPumpResult(position=consumer.position)
            stored = Snapshot.parse(consumer.snapshot or EARLIEST_SNAPSHOT)
            rows = self._fetchall(
                "stream_pump.events",
                {
                    "xmin": stored.xmin,
                    "snapshot": str(stored),
                    "xid": consumer.position.xid,
                    "seq": consumer.position.seq,
                    "regex": topics.pattern_regex(consumer.pattern),
                    "limit": limit,
                },
            )
            current = Snapshot.parse(rows[0][0]).without(rows[0][1])
            events = [event_from_row(r[2:]) for r in rows if r[2] is not None]
            if len(events) < limit:
                snapshot, position = str(current), StreamPosition()
            else:
                last = events[-1].position
                snapshot = str(advance(stored, current, last.xid, consumer.position.xid))
                position = last
            if events:
                self.job_insert_many(
                    topics.event_deliveries(consumer, events), JobInsertOpts(notify=True, now=now)
                )
            self._execute(
                "stream_pump.advance",
                {
                    "name": name,
                    "snapshot": snapshot,
                    "xid": position.xid,
                    "seq": position.seq,
                    "delivered": bool(events),
                    "now": now,
                },
            )
        return StreamPumpResult(
            delivered=len(events),
            position=position,
            queues=[consumer.queue] if events else [],
        )

    def _stream_prune(self, params: StreamPruneParams) -> int:
        """Delete one chunk of events past retention."""
        return self._execute(
            "stream_prune",
            {"now": params.now, "retention": params.retention, "limit": params.limit},
        )

    def _stream_consumer_pause(self, params: StreamConsumerPauseParams) -> StreamConsumerRow | None:
        """Set paused_at, keeping an earlier one."""
        row = self._fetchone("stream_consumer_pause", {"name": params.name, "now": params.now})
        return None if row is None else consumer_from_row(row)

    def _stream_consumer_resume(
        self, params: StreamConsumerResumeParams
    ) -> StreamConsumerRow | None:
        """Clear paused_at."""
        row = self._fetchone("stream_consumer_resume", {"name": params.name, "now": params.now})
        return None if row is None else consumer_from_row(row)

    def _stream_consumer_delete(
        self, params: StreamConsumerDeleteParams
    ) -> StreamConsumerRow | None:
        """Delete the row; return it as it was."""
        row = self._fetchone("stream_consumer_delete", {"name": params.name})
        return None if row is None else consumer_from_row(row)

    def _stream_consumer_waiting(self, name: str) -> list[JobID]:
        """Return the IDs of the consumer's deliveries that are not running."""
        return [r[0] for r in self._fetchall("stream_consumer_delete.waiting", {"name": name})]

    def _stream_consumer_lag(
        self, consumers: Sequence[StreamConsumerRow], window: int
    ) -> list[StreamConsumerLag]:
        """Count matches in each consumer's window of waiting events, in one statement
        (patterns as regexes)."""
        rows = self._fetchall(
            "stream_consumer_lag",
            {
                "names": [c.name for c in consumers],
                "regexes": [topics.pattern_regex(c.pattern) for c in consumers],
                "window": window,
            },
        )
        return [
            StreamConsumerLag(
                name=name, events=int(matched), capped=int(waiting) >= window, oldest_at=oldest
            )
            for name, waiting, matched, oldest in rows
        ]
