"""The periodic job admins: registrations of live clients and the last slots inserted."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from django_hopper.admin.common import (
    EMPTY,
    ROW_EXTRA,
    ReadOnlyAdmin,
    client_link,
    job_link,
    job_refs,
    pretty,
    row_extra,
    seconds_text,
    time_column,
    time_text,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.models import (
    Client,
    PeriodicRegistration,
    PeriodicSlot,
)
from django_hopper.periodic import Schedule


def _schedule_text(definition: Any) -> str:
    """Describe a registered definition's schedule: its cron (and zone) or its interval."""
    if not isinstance(definition, dict):
        return EMPTY
    if definition.get("cron"):
        return f"cron {definition['cron']} ({definition.get('tz') or 'UTC'})"
    if definition.get("every"):
        return f"every {seconds_text(definition['every'])}"
    return EMPTY


@admin.register(PeriodicRegistration)
class PeriodicRegistrationAdmin(ReadOnlyAdmin):
    """Periodic jobs as the live clients declare them; the leader inserts from these."""

    list_display = ("name", "schedule", "next_run", "kind", "client", "short_digest", "registered")
    list_filter = ("name",)
    search_fields = ("name",)
    ordering = ("name", "client_id")
    fields = (
        "name",
        "schedule",
        "next_run",
        "kind",
        "client",
        "digest",
        "registered",
        "definition_pretty",
    )
    readonly_fields = fields

    registered = time_column("registered_at", "registered at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """List only registrations of clients whose lease has not expired (by database time)."""
        live = Client.objects.filter(expires_at__gt=Now()).values("id")
        return super().get_queryset(request).filter(client_id__in=live)

    @admin.display(description="schedule")
    def schedule(self, obj: PeriodicRegistration) -> str:
        return _schedule_text(obj.definition)

    @admin.display(description="next run")
    def next_run(self, obj: PeriodicRegistration) -> str:
        """Show the next slot of the schedule after now (the leader inserts it when due)."""
        definition = obj.definition if isinstance(obj.definition, dict) else {}
        try:
            schedule = Schedule.parse(
                definition.get("cron"), definition.get("every"), definition.get("tz")
            )
        except InvalidJob:
            return EMPTY
        return time_text(schedule.next_after(timezone.now()))

    @admin.display(description="kind")
    def kind(self, obj: PeriodicRegistration) -> str:
        return str(obj.definition.get("kind", EMPTY)) if isinstance(obj.definition, dict) else EMPTY

    @admin.display(description="client", ordering="client_id")
    def client(self, obj: PeriodicRegistration) -> SafeString:
        return client_link(obj.client_id)

    @admin.display(description="digest")
    def short_digest(self, obj: PeriodicRegistration) -> str:
        return obj.digest[:12]

    @admin.display(description="definition")
    def definition_pretty(self, obj: PeriodicRegistration) -> SafeString:
        return pretty(obj.definition)


@admin.register(PeriodicSlot)
class PeriodicSlotAdmin(ReadOnlyAdmin):
    """The last slot inserted per periodic job, and the job it inserted."""

    list_display = ("name", "last_slot_time", "inserted", "job")
    search_fields = ("name",)
    ordering = ("name",)
    fields = ("name", "last_slot_time", "inserted", "job")
    readonly_fields = fields

    last_slot_time = time_column("last_slot", "last slot")
    inserted = time_column("inserted_at", "inserted at")

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Find where each slot's job is (live or history) in two queries for the page."""
        refs = job_refs(slot.job_id for slot in rows if slot.job_id)
        for slot in rows:
            setattr(slot, ROW_EXTRA, refs)

    @admin.display(description="job")
    def job(self, obj: PeriodicSlot) -> SafeString:
        if obj.job_id is None:
            return mark_safe(EMPTY)
        refs = row_extra(obj)
        if refs is None:
            refs = job_refs([obj.job_id])
        return job_link(obj.job_id, refs.get(obj.job_id, (None, None))[0])
