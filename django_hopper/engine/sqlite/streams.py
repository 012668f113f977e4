"""Stream methods of the SQLite engine; SQL in ``queries/streams.sql``.

SQLite has one writer at a time, so an event's seq is taken under the write
lock and seq order is commit order: a consumer's position is the last seq it
has read, and no event can commit behind it later.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
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
from django_hopper.engine.sqlite.convert import db_time, dumps, from_db_time
from django_hopper.engine.sqlite.pubsub import load_object, route_params
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.ids import new_id
from django_hopper.types import (
    JobID,
    StreamConsumerLag,
    StreamConsumerRow,
    StreamEvent,
    StreamPosition,
)


def event_from_row(r: Sequence[Any]) -> StreamEvent:
    """Build a StreamEvent from (seq, xid, topic, key, payload, headers, message_id,
    created_at), tolerating columns that do not decode (:func:`topics.decoded_event`)."""
    return topics.decoded_event(
        StreamPosition(xid=int(r[1]), seq=int(r[0])),
        r[2],
        r[3],
        r[6],
        payload=lambda: load_object(r[4]),
        headers=lambda: load_object(r[5]),
        created_at=lambda: from_db_time(r[7]),
    )


def consumer_from_row(r: Sequence[Any]) -> StreamConsumerRow:
    """Build a StreamConsumerRow from the consumer columns the queries select."""
    return StreamConsumerRow(
        name=r[0],
        pattern=r[1],
        kind=r[2],
        queue=r[3],
        max_attempts=int(r[4]),
        metadata=load_object(r[5]) or {},
        start=r[6],
        snapshot=r[7],
        position=StreamPosition(xid=int(r[8]), seq=int(r[9])),
        delivered_at=from_db_time(r[10]),
        created_at=from_db_time(r[11]),
        updated_at=from_db_time(r[12]),
        paused_at=from_db_time(r[13]),
    )


class StreamsMixin(SQLiteSupport):
    """The stream log and its consumers, positioned by seq."""

    @translate_errors
    def _stream_append(self, params: StreamAppendParams) -> StreamEvent:
        """Append one event (xid 0)."""
        _, now_s = self._now(params.now)
        message_id = params.message_id or new_id().hex
        with self._cursor() as c:
            c.execute(
                Q["stream_append"],
                {
                    "topic": params.topic,
                    "key": params.key,
                    "payload": dumps(params.payload, "payload"),
                    "headers": dumps(dict(params.headers), "headers"),
                    "message_id": message_id,
                    "now": now_s,
                },
            )
            seq = int(c.fetchone()[0])
        # SQLite has no notifications: consumers are pumped by the leader's poll.
        return StreamEvent(
            position=StreamPosition(xid=0, seq=seq),
            topic=params.topic,
            key=params.key,
            payload=params.payload,
            headers=dict(params.headers),
            message_id=message_id,
            created_at=from_db_time(now_s),
        )

    @translate_errors
    def _stream_read(self, params: StreamReadParams) -> list[StreamEvent]:
        """Page through events after a position, in position order."""
        with self._cursor() as c:
            c.execute(
                Q["stream_read"],
                {
                    "xid": params.after.xid,
                    "seq": params.after.seq,
                    "pattern": params.pattern,
                    "limit": params.limit,
                },
            )
            return [event_from_row(r) for r in c.fetchall()]

    @translate_errors
    def _stream_consumer_upsert(
        self, rows: Sequence[StreamConsumerRow], now: dt.datetime | None = None
    ) -> None:
        """Upsert consumers in one transaction; a new one starts at its ``start``."""
        checked = {r.name: r for r in rows}
        _, now_s = self._now(now)
        with self._atomic(), self._cursor() as c:
            c.executemany(
                Q["stream_consumer_upsert"],
                [{**route_params(r, now_s), "start": r.start} for r in checked.values()],
            )

    @translate_errors
    def _stream_consumer_list(self) -> list[StreamConsumerRow]:
        """Return every consumer with its position."""
        with self._cursor() as c:
            c.execute(Q["stream_consumer_list"])
            return [consumer_from_row(r) for r in c.fetchall()]

    @translate_errors
    def _stream_consumer_seek(
        self, name: str, params: StreamSeekParams, mode: str
    ) -> StreamConsumerRow | None:
        """Move a consumer's seq in one statement."""
        _, now_s = self._now(None)
        with self._atomic(), self._cursor() as c:
            c.execute(
                Q["stream_consumer_seek"],
                {
                    "name": name,
                    "mode": mode,
                    "seq": params.position.seq if params.position is not None else 0,
                    "time": db_time(params.time, "time") if params.time is not None else None,
                    "now": now_s,
                },
            )
            row = c.fetchone()
        return None if row is None else consumer_from_row(row)

    @translate_errors
    def _stream_pump(
        self, name: str, limit: int, now: dt.datetime | None = None
    ) -> StreamPumpResult | None:
        """Deliver up to ``limit`` matching events after the consumer's seq, and move it.

        Having read every match, the consumer moves past the last event
        appended, so that events its pattern skips are not scanned again.
        """
        _, now_s = self._now(now)
        with self._atomic(), self._cursor() as c:
            c.execute(Q["stream_pump"], {"name": name})
            row = c.fetchone()
            if row is None:
                return None
            consumer = consumer_from_row(row)
            if topics.pump_stops(consumer, limit):
                return StreamPumpResult(position=consumer.position)
            c.execute(
                Q["stream_pump.events"],
                {
                    "seq": consumer.position.seq,
                    "pattern": consumer.pattern,
                    "limit": limit,
                },
            )
            events = [event_from_row(r) for r in c.fetchall()]
            if len(events) == limit:
                seq = events[-1].position.seq
            else:
                c.execute(Q["stream_pump.last"])
                seq = max(int(c.fetchone()[0]), consumer.position.seq)
            if events:
                self.job_insert_many(
                    topics.event_deliveries(consumer, events), JobInsertOpts(notify=True, now=now)
                )
            c.execute(
                Q["stream_pump.advance"],
                {"name": name, "seq": seq, "delivered": bool(events), "now": now_s},
            )
        return StreamPumpResult(
            delivered=len(events),
            position=StreamPosition(xid=0, seq=seq),
            queues=[consumer.queue] if events else [],
        )

    @translate_errors
    def _stream_prune(self, params: StreamPruneParams) -> int:
        """Delete one chunk of events past retention."""
        now, _ = self._now(params.now)
        with self._cursor() as c:
            c.execute(
                Q["stream_prune"],
                {"cutoff": db_time(now - params.retention), "limit": params.limit},
            )
            return int(c.rowcount)

    def _consumer_update(
        self, query: str, name: str, now: dt.datetime | None
    ) -> StreamConsumerRow | None:
        """Run one of the consumer's row updates; return the row, or None if unknown."""
        _, now_s = self._now(now)
        with self._atomic(), self._cursor() as c:
            c.execute(Q[query], {"name": name, "now": now_s})
            row = c.fetchone()
        return None if row is None else consumer_from_row(row)

    @translate_errors
    def _stream_consumer_pause(self, params: StreamConsumerPauseParams) -> StreamConsumerRow | None:
        """Set paused_at, keeping an earlier one."""
        return self._consumer_update("stream_consumer_pause", params.name, params.now)

    @translate_errors
    def _stream_consumer_resume(
        self, params: StreamConsumerResumeParams
    ) -> StreamConsumerRow | None:
        """Clear paused_at."""
        return self._consumer_update("stream_consumer_resume", params.name, params.now)

    @translate_errors
    def _stream_consumer_delete(
        self, params: StreamConsumerDeleteParams
    ) -> StreamConsumerRow | None:
        """Delete the row; return it as it was."""
        with self._atomic(), self._cursor() as c:
            c.execute(Q["stream_consumer_delete"], {"name": params.name})
            row = c.fetchone()
        return None if row is None else consumer_from_row(row)

    @translate_errors
    def _stream_consumer_waiting(self, name: str) -> list[JobID]:
        """Return the IDs of the consumer's deliveries that are not running."""
        with self._cursor() as c:
            c.execute(Q["stream_consumer_delete.waiting"], {"name": name})
            return [uuid.UUID(r[0]) for r in c.fetchall()]

    @translate_errors
    def _stream_consumer_lag(
        self, consumers: Sequence[StreamConsumerRow], window: int
    ) -> list[StreamConsumerLag]:
        """Count matches in each consumer's window of events after its seq, in one
        statement."""
        with self._cursor() as c:
            c.execute(
                Q["stream_consumer_lag"],
                {"names": json.dumps([r.name for r in consumers]), "window": window},
            )
            rows = [(name, json.loads(counts)) for name, counts in c.fetchall()]
        return [
            StreamConsumerLag(
                name=name,
                events=int(matched),
                capped=int(waiting) >= window,
                oldest_at=from_db_time(oldest),
            )
            for name, (waiting, matched, oldest) in rows
        ]
