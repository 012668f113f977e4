"""Pub/sub methods of the SQLite engine; SQL in ``queries/pubsub.sql``."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from django_hopper.engine.params import (
    SubscriptionDeleteParams,
    SubscriptionPauseParams,
    SubscriptionResumeParams,
    SubscriptionResumeResult,
)
from django_hopper.engine.sqlite.convert import _loads, db_time, dumps, from_db_time
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.types import HELD_AT, JobID, StreamConsumerRow, SubscriptionRow


def load_object(value: Any) -> Any:
    """Read a JSON column that Django may or may not have decoded already."""
    if isinstance(value, str):
        return _loads(value)
    return value


def subscription_from_row(r: Sequence[Any]) -> SubscriptionRow:
    """Build a SubscriptionRow from (name, pattern, kind, queue, max_attempts, metadata,
    created_at, updated_at, paused_at)."""
    return SubscriptionRow(
        name=r[0],
        pattern=r[1],
        kind=r[2],
        queue=r[3],
        max_attempts=int(r[4]),
        metadata=load_object(r[5]) or {},
        created_at=from_db_time(r[6]),
        updated_at=from_db_time(r[7]),
        paused_at=from_db_time(r[8]),
    )


def route_params(row: SubscriptionRow | StreamConsumerRow, now_s: str) -> dict[str, Any]:
    """Return the upsert parameters a subscription and a stream consumer share."""
    return {
        "name": row.name,
        "pattern": row.pattern,
        "kind": row.kind,
        "queue": row.queue,
        "max_attempts": row.max_attempts,
        "metadata": dumps(row.metadata, "metadata"),
        "now": now_s,
    }


class PubSubMixin(SQLiteSupport):
    """Subscriptions (upsert, list, pause, resume, delete) and message_publish."""

    @translate_errors
    def _subscription_upsert(
        self, rows: Sequence[SubscriptionRow], now: dt.datetime | None = None
    ) -> None:
        """Upsert subscriptions in one transaction; of two rows with one name the last wins."""
        checked = {r.name: r for r in rows}
        _, now_s = self._now(now)
        with self._atomic(), self._cursor() as c:
            c.executemany(
                Q["subscription_upsert"],
                [route_params(s, now_s) for s in checked.values()],
            )

    @translate_errors
    def _subscription_list(self) -> list[SubscriptionRow]:
        """Return every subscription, by name."""
        with self._cursor() as c:
            c.execute(Q["subscription_list"])
            return [subscription_from_row(r) for r in c.fetchall()]

    @translate_errors
    def _message_subscriptions(
        self, now: dt.datetime | None
    ) -> tuple[list[SubscriptionRow], dt.datetime]:
        """Read every subscription; the time is ``now``, or this process's clock."""
        at, _ = self._now(now)
        with self._cursor() as c:
            c.execute(Q["message_publish"])
            return [subscription_from_row(r) for r in c.fetchall()], at

    @translate_errors
    def _subscription_pause(self, params: SubscriptionPauseParams) -> SubscriptionRow | None:
        """Set paused_at, keeping an earlier one."""
        _, now_s = self._now(params.now)
        with self._atomic(), self._cursor() as c:
            c.execute(Q["subscription_pause"], {"name": params.name, "now": now_s})
            row = c.fetchone()
        return None if row is None else subscription_from_row(row)

    @translate_errors
    def _subscription_resume(
        self, params: SubscriptionResumeParams
    ) -> SubscriptionResumeResult | None:
        """Clear paused_at and make the held deliveries due now, in one transaction."""
        _, now_s = self._now(params.now)
        args = {"name": params.name, "now": now_s}
        with self._atomic(), self._cursor() as c:
            c.execute(Q["subscription_resume"], args)
            row = c.fetchone()
            if row is None:
                return None
            c.execute(
                Q["subscription_resume.release"], {**args, "held_at": db_time(HELD_AT, "held_at")}
            )
            queues = [q for (q,) in c.fetchall()]
        return SubscriptionResumeResult(
            subscription=subscription_from_row(row),
            released=len(queues),
            queues=sorted(set(queues)),
        )

    @translate_errors
    def _subscription_delete(self, params: SubscriptionDeleteParams) -> SubscriptionRow | None:
        """Delete the row; return it as it was."""
        with self._atomic(), self._cursor() as c:
            c.execute(Q["subscription_delete"], {"name": params.name})
            row = c.fetchone()
        return None if row is None else subscription_from_row(row)

    @translate_errors
    def _subscription_waiting(self, name: str) -> list[JobID]:
        """Return the IDs of the subscription's deliveries that are not running."""
        with self._cursor() as c:
            c.execute(Q["subscription_delete.waiting"], {"name": name})
            return [uuid.UUID(r[0]) for r in c.fetchall()]
