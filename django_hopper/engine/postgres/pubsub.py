"""Pub/sub methods of the PostgreSQL engine; SQL in ``queries/pubsub.sql``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django_hopper.engine.params import (
    SubscriptionDeleteParams,
    SubscriptionPauseParams,
    SubscriptionResumeParams,
    SubscriptionResumeResult,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.support import PostgresSupport
from django_hopper.types import HELD_AT, JobID, StreamConsumerRow, SubscriptionRow


def subscription_from_row(r: Sequence[Any]) -> SubscriptionRow:
    """Build a SubscriptionRow from (name, pattern, kind, queue, max_attempts, metadata,
    created_at, updated_at, paused_at)."""
    return SubscriptionRow(
        name=r[0],
        pattern=r[1],
        kind=r[2],
        queue=r[3],
        max_attempts=int(r[4]),
        metadata=convert.load_json(r[5]) or {},
        created_at=r[6],
        updated_at=r[7],
        paused_at=r[8],
    )


def route_columns(rows: Sequence[SubscriptionRow | StreamConsumerRow]) -> dict[str, list[Any]]:
    """Return the upsert's column arrays a subscription and a stream consumer share."""
    return {
        "names": [r.name for r in rows],
        "patterns": [r.pattern for r in rows],
        "kinds": [r.kind for r in rows],
        "queues": [r.queue for r in rows],
        "max_attempts": [r.max_attempts for r in rows],
        "metadata": [convert.dump_json(r.metadata, "metadata") for r in rows],
    }


class PubSubMixin(PostgresSupport):
    """Subscriptions (upsert, list, pause, resume, delete) and message_publish."""

    def _subscription_upsert(
        self, rows: Sequence[SubscriptionRow], now: dt.datetime | None = None
    ) -> None:
        """Upsert subscriptions in one statement; of two rows with one name the last wins."""
        checked = {r.name: r for r in rows}
        self._execute("subscription_upsert", {"now": now, **route_columns(list(checked.values()))})

    def _subscription_list(self) -> list[SubscriptionRow]:
        """Return every subscription, by name."""
        return [subscription_from_row(r) for r in self._fetchall("subscription_list", {})]

    def _message_subscriptions(
        self, now: dt.datetime | None
    ) -> tuple[list[SubscriptionRow], dt.datetime]:
        """Read every subscription and the database time in one statement."""
        rows = self._fetchall("message_publish", {"now": now})
        return [subscription_from_row(r) for r in rows if r[0] is not None], rows[0][9]

    def _subscription_pause(self, params: SubscriptionPauseParams) -> SubscriptionRow | None:
        """Set paused_at, keeping an earlier one."""
        row = self._fetchone("subscription_pause", {"name": params.name, "now": params.now})
        return None if row is None else subscription_from_row(row)

    def _subscription_resume(
        self, params: SubscriptionResumeParams
    ) -> SubscriptionResumeResult | None:
        """Clear paused_at and make the held deliveries due now, in one transaction."""
        args = {"name": params.name, "now": params.now}
        with self._atomic():
            row = self._fetchone("subscription_resume", args)
            if row is None:
                return None
            queues = self._fetchall("subscription_resume.release", {**args, "held_at": HELD_AT})
        return SubscriptionResumeResult(
            subscription=subscription_from_row(row),
            released=len(queues),
            queues=sorted({q for (q,) in queues}),
        )

    def _subscription_delete(self, params: SubscriptionDeleteParams) -> SubscriptionRow | None:
        """Delete the row; return it as it was."""
        row = self._fetchone("subscription_delete", {"name": params.name})
        return None if row is None else subscription_from_row(row)

    def _subscription_waiting(self, name: str) -> list[JobID]:
        """Return the IDs of the subscription's deliveries that are not running."""
        return [r[0] for r in self._fetchall("subscription_delete.waiting", {"name": name})]
