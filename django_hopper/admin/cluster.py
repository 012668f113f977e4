"""The cluster admins: clients (worker processes) and the leader lease."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_hopper.admin.common import (
    ROW_EXTRA,
    AliasAdminMixin,
    ReadOnlyAdmin,
    admin_url,
    bounded_stats,
    client_link,
    on_alias,
    pretty,
    read_stats,
    row_alias,
    row_extra_or_read,
    time_column,
)
from django_hopper.admin.filters import DatabaseFilter
from django_hopper.models import (
    Client,
    Leader,
)
from django_hopper.types import Stats


class LeaseAdmin(AliasAdminMixin, ReadOnlyAdmin):
    """A read-only admin of rows holding a lease, whose liveness is read by database time.

    Each database has its own clients and leader: the list shows one alias at
    a time (the database filter, hidden with one alias).
    """

    list_filter: Any = (DatabaseFilter,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Read each lease's liveness by database time, the clock leases are granted by."""
        live = ExpressionWrapper(Q(expires_at__gt=Now()), output_field=BooleanField())
        return super().get_queryset(request).annotate(lease_live=live)

    expires = time_column("expires_at", "expires at")

    @admin.display(boolean=True, description="lease live", ordering="expires_at")
    def live(self, obj: Client | Leader) -> bool:
        return bool(getattr(obj, "lease_live", False))


@admin.register(Client)
class ClientAdmin(LeaseAdmin):
    """Worker processes and their leases; an expired lease means the client is fenced."""

    list_display = ("id", "hostname", "live", "leads", "running", "started", "expires")
    search_fields = ("hostname",)
    ordering = ("-id",)
    readonly_fields = (
        "id",
        "hostname",
        "live",
        "leads",
        "running",
        "started",
        "expires",
        "info_pretty",
    )
    fields = readonly_fields

    started = time_column("started_at", "started at")

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach the leader and running counts from one stats read of the page's alias."""
        stats = read_stats(self, request, row_alias(rows[0]))
        for client in rows:
            setattr(client, ROW_EXTRA, stats)

    def _cluster(self, obj: Client) -> Stats:
        stats: Stats = row_extra_or_read(obj, lambda: bounded_stats(row_alias(obj)))
        return stats

    @admin.display(boolean=True, description="leader")
    def leads(self, obj: Client) -> bool:
        return self._cluster(obj).leader == obj.id

    @admin.display(description="running jobs")
    def running(self, obj: Client) -> SafeString:
        """Count the client's running jobs, linking them in the live list."""
        count = self._cluster(obj).running_by_client.get(obj.id, 0)
        if not count:
            return format_html("{}", 0)
        url = admin_url("job", "changelist") + f"?state=running&attempted_by={obj.id}"
        url = on_alias(url, row_alias(obj))  # the client's jobs are on its database
        return format_html('<a href="{}">{}</a>', url, count)

    @admin.display(description="info")
    def info_pretty(self, obj: Client) -> SafeString:
        return pretty(obj.info)


@admin.register(Leader)
class LeaderAdmin(LeaseAdmin):
    """The leader lease: which client runs the maintenance services."""

    list_display = ("name", "client", "live", "elected", "expires")
    ordering = ("name",)
    fields = list_display

    elected = time_column("elected_at", "elected at")
    readonly_fields = fields

    @admin.display(description="client", ordering="client_id")
    def client(self, obj: Leader) -> SafeString:
        return client_link(obj.client_id, row_alias(obj))
