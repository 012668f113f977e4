"""Pub/sub methods of the PostgreSQL engine; SQL in ``queries/pubsub.sql``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django_hopper.engine import topics
from django_hopper.engine.params import JobInsertOpts, JobInsertResult, MessagePublishParams
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.support import PostgresSupport
from django_hopper.ids import new_id
from django_hopper.types import StreamConsumerRow, SubscriptionRow


def subscription_from_row(r: Sequence[Any]) -> SubscriptionRow:
    """Build a SubscriptionRow from (name, pattern, kind, queue, max_attempts, metadata,
    created_at, updated_at)."""
    return SubscriptionRow(
        name=r[0],
        pattern=r[1],
        kind=r[2],
        queue=r[3],
        max_attempts=int(r[4]),
        metadata=convert.load_json(r[5]) or {},
        created_at=r[6],
        updated_at=r[7],
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
    """subscription_upsert, subscription_list and message_publish."""

    def _subscription_upsert(
        self, rows: Sequence[SubscriptionRow], now: dt.datetime | None = None
    ) -> None:
        """Upsert subscriptions in one statement; of two rows with one name the last wins."""
        checked = {r.name: r for r in rows}
        self._execute("subscription_upsert", {"now": now, **route_columns(list(checked.values()))})

    def _subscription_list(self) -> list[SubscriptionRow]:
        """Return every subscription, by name."""
        return [subscription_from_row(r) for r in self._fetchall("subscription_list", {})]

    def _message_publish(self, params: MessagePublishParams) -> list[JobInsertResult]:
        """Match the subscriptions in Python and insert the deliveries in one statement.

        Both statements run in one transaction (the caller's, if any), so the
        deliveries commit or roll back with whatever the caller writes.
        """
        with self._atomic():
            rows = self._fetchall("message_publish", {"now": params.now})
            db_now: dt.datetime = rows[0][8]
            subs = [subscription_from_row(r) for r in rows if r[0] is not None]
            scheduled_at = db_now + params.delay if params.delay else None
            deliveries = topics.publish_deliveries(
                subs, params, params.message_id or new_id().hex, scheduled_at
            )
            if not deliveries:
                return []
            return self.job_insert_many(
                deliveries, JobInsertOpts(notify=params.notify, now=params.now)
            )
