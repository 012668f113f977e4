"""The subscription and stream consumer admins: list, pause, resume, reset, delete, lag.

Both tables are small (one row per declared subscriber), so an action calls
the api once per selected row, as the queue admin does; each action reports
once and leaves one ``LogEntry``. A consumer's lag is read for the whole page
in one engine call (``consumer_lag``), each reading a window of at most
:data:`LAG_WINDOW` waiting events, so the page costs the same whatever the log.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from django_hopper import pubsub, streams
from django_hopper.admin.common import (
    EMPTY,
    ROW_EXTRA,
    FieldsetsViewAdmin,
    Outcomes,
    pretty,
    row_extra_or_read,
    seconds_text,
    time_column,
    time_text,
)
from django_hopper.admin.filters import PausedFilter
from django_hopper.engine.params import RouteDeleteResult
from django_hopper.exceptions import HopperError
from django_hopper.models import Job, StreamConsumer, Subscription
from django_hopper.types import HELD_AT, StreamConsumerLag

#: Waiting events read per consumer for its lag column (about 5 ms each on
#: PostgreSQL, 7 ms on SQLite); beyond it the column says "N+".
LAG_WINDOW = 1_000


def paused_text(paused_at: dt.datetime | None) -> SafeString:
    """Say whether a subscription or consumer is paused, and since when."""
    if paused_at is None:
        return mark_safe("delivering")
    return format_html(
        '<strong class="hopper-paused">paused</strong> since {}', time_text(paused_at)
    )


class RouteAdmin(FieldsetsViewAdmin):
    """What the subscription and the consumer admins share: the paused filter, the
    actions' reporting, and the two deletes."""

    list_filter = (PausedFilter,)
    search_fields = ("name",)
    ordering = ("name",)
    sortable_by = ("name",)
    noun = ""

    paused_since = time_column("paused_at", "paused at")
    created = time_column("created_at", "created at")
    updated = time_column("updated_at", "updated at")

    @admin.display(description="state", ordering="paused_at")
    def state(self, obj: Any) -> SafeString:
        return paused_text(obj.paused_at)

    @admin.display(description="metadata")
    def metadata_pretty(self, obj: Any) -> SafeString:
        return pretty(obj.metadata)

    @admin.display(description="max attempts")
    def attempts_text(self, obj: Any) -> str:
        return str(obj.max_attempts) if obj.max_attempts else "default"

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        call: Callable[[str], Any],
        verb: str,
        done: str,
        deletion: bool = False,
    ) -> list[Any]:
        """Call an api function per selected name; report once; return the results."""
        results: list[Any] = []

        def run(name: str) -> None:
            results.append(call(name))

        outcomes = Outcomes(verb, self.noun, deletion=deletion)
        self._apply_each(request, queryset.values_list("name", flat=True), run, outcomes, done)
        return results

    def _delete(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        call: Callable[..., RouteDeleteResult],
        cancel_pending: bool,
    ) -> None:
        """Delete the selection; say what became of their deliveries in a second message."""
        results: list[RouteDeleteResult] = self._each(
            request,
            queryset,
            lambda name: call(name, cancel_pending=cancel_pending),
            "delete",
            "deleted",
            deletion=True,
        )
        canceled = sum(r.canceled for r in results)
        released = sum(r.released for r in results)
        if results:
            text = (
                f"Their deliveries: {canceled} canceled (running ones finish)."
                if cancel_pending
                else f"Their deliveries already made still run ({released} held ones released)."
            )
            self.message_user(request, text, messages.INFO)


@admin.register(Subscription)
class SubscriptionAdmin(RouteAdmin):
    """Pub/sub subscriptions: pause (deliveries held), resume (released), delete."""

    noun = "subscription"
    list_display = ("name", "pattern", "kind", "queue", "state", "attempts_text", "updated")
    actions = (
        "pause_subscriptions",
        "resume_subscriptions",
        "delete_subscriptions",
        "delete_subscriptions_cancel_pending",
    )
    fieldsets = (
        (None, {"fields": ("name", "pattern", "kind", "queue", "attempts_text")}),
        ("State", {"fields": ("state", "held", "created", "updated")}),
        ("Deliveries", {"fields": ("metadata_pretty",)}),
    )

    @admin.display(description="held deliveries")
    def held(self, obj: Subscription) -> str:
        """Count the deliveries a pause holds (detail page only: it reads the live table)."""
        if obj.paused_at is None:
            return EMPTY
        try:
            held = Job.objects.filter(
                state="scheduled", scheduled_at__gte=HELD_AT, metadata__subscription=obj.name
            ).count()
        except DatabaseError:  # SQLite: a job whose metadata is not JSON at all
            return "unknown (a held job's metadata does not decode)"
        return f"{held} (released on resume)"

    @admin.action(
        description="Pause selected subscriptions (hold deliveries)", permissions=("operate",)
    )
    def pause_subscriptions(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, pubsub.pause_subscription, "pause", "paused")

    @admin.action(
        description="Resume selected subscriptions (release held deliveries)",
        permissions=("operate",),
    )
    def resume_subscriptions(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        results = self._each(request, queryset, pubsub.resume_subscription, "resume", "resumed")
        released = sum(r.released for r in results)
        if released:
            self.message_user(request, f"{released} held deliveries released.", messages.INFO)

    @admin.action(
        description="Delete selected subscriptions (their deliveries still run)",
        permissions=("operate",),
    )
    def delete_subscriptions(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._delete(request, queryset, pubsub.unsubscribe, cancel_pending=False)

    @admin.action(
        description="Delete selected subscriptions and cancel their waiting deliveries",
        permissions=("operate",),
    )
    def delete_subscriptions_cancel_pending(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> None:
        self._delete(request, queryset, pubsub.unsubscribe, cancel_pending=True)


@admin.register(StreamConsumer)
class StreamConsumerAdmin(RouteAdmin):
    """Stream consumers: position, lag, pause, resume, reset to start, skip, delete."""

    noun = "consumer"
    list_display = (
        "name",
        "pattern",
        "kind",
        "queue",
        "state",
        "lag",
        "oldest_waiting",
        "delivered",
    )
    actions = (
        "pause_consumers",
        "resume_consumers",
        "reset_consumers",
        "skip_to_latest",
        "delete_consumers",
        "delete_consumers_cancel_pending",
    )
    fieldsets = (
        (None, {"fields": ("name", "pattern", "kind", "queue", "attempts_text", "start")}),
        (
            "Position",
            {"fields": ("state", "lag", "oldest_waiting", "position", "delivered", "snapshot")},
        ),
        ("Times", {"fields": ("created", "updated")}),
        ("Deliveries", {"fields": ("metadata_pretty",)}),
    )

    delivered = time_column("delivered_at", "last delivery")

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Read the page's lags in one engine call (each a bounded window)."""
        lags = self._lags(request, [row.name for row in rows])
        for row in rows:
            setattr(row, ROW_EXTRA, lags.get(row.name))

    def _lags(self, request: HttpRequest | None, names: list[str]) -> dict[str, StreamConsumerLag]:
        try:
            return {lag.name: lag for lag in streams.consumer_lag(names, limit=LAG_WINDOW)}
        except HopperError as exc:
            if request is not None:
                self.message_user(request, f"Lag unavailable: {exc}", messages.WARNING)
            return {}

    def _lag(self, obj: StreamConsumer) -> StreamConsumerLag | None:
        lag: StreamConsumerLag | None = row_extra_or_read(
            obj, lambda: self._lags(None, [obj.name]).get(obj.name)
        )
        return lag

    @admin.display(description="lag (events)")
    def lag(self, obj: StreamConsumer) -> str:
        lag = self._lag(obj)
        if lag is None:
            return EMPTY
        # Capped: more events wait than the window read, so the count is a floor.
        return f"{lag.events:,}+" if lag.capped else f"{lag.events:,}"

    @admin.display(description="oldest waiting")
    def oldest_waiting(self, obj: StreamConsumer) -> str:
        """Say how long the oldest undelivered event has waited (the consumer's age lag)."""
        lag = self._lag(obj)
        if lag is None or lag.oldest_at is None:
            return EMPTY
        return seconds_text(max(timezone.now() - lag.oldest_at, dt.timedelta(0)))

    @admin.display(description="position")
    def position(self, obj: StreamConsumer) -> str:
        return f"xid {obj.position_xid}, seq {obj.position_seq}"

    @admin.action(description="Pause selected consumers", permissions=("operate",))
    def pause_consumers(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, streams.pause_consumer, "pause", "paused")

    @admin.action(description="Resume selected consumers", permissions=("operate",))
    def resume_consumers(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, streams.resume_consumer, "resume", "resumed")

    @admin.action(
        description="Reset selected consumers to their start (earliest: replay)",
        permissions=("operate",),
    )
    def reset_consumers(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(request, queryset, streams.reset_consumer, "reset", "reset")

    @admin.action(
        description="Skip selected consumers to the latest event (drop the backlog)",
        permissions=("operate",),
    )
    def skip_to_latest(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._each(
            request, queryset, lambda name: streams.seek(name, latest=True), "skip", "skipped"
        )

    @admin.action(
        description="Delete selected consumers (their deliveries still run)",
        permissions=("operate",),
    )
    def delete_consumers(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._delete(request, queryset, streams.delete_consumer, cancel_pending=False)

    @admin.action(
        description="Delete selected consumers and cancel their waiting deliveries",
        permissions=("operate",),
    )
    def delete_consumers_cancel_pending(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> None:
        self._delete(request, queryset, streams.delete_consumer, cancel_pending=True)
