"""The periodic job admins: registrations of live clients, their state (enabled, last
slot), and the operator's run now, disable and enable."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from django_hopper import periodic
from django_hopper.admin.common import (
    EMPTY,
    ROW_EXTRA,
    Outcomes,
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
from django_hopper.exceptions import HopperError, InvalidJob
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
    """Periodic jobs as the live clients declare them; the leader inserts from these.

    Run now, disable and enable act on the job's name (every client's row of
    it at once); whether it is enabled and its last slot come from one read of
    the state rows for the page.
    """

    list_display = (
        "name",
        "schedule",
        "enabled",
        "next_run",
        "last_slot",
        "kind",
        "client",
        "short_digest",
        "registered",
    )
    actions = ("run_now", "disable", "enable")
    list_filter = ("name",)
    search_fields = ("name",)
    ordering = ("name", "client_id")
    fields = (
        "name",
        "schedule",
        "enabled",
        "next_run",
        "last_slot",
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

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach each name's state row, read once for the page."""
        names = {row.name for row in rows}
        states = {s.name: s for s in PeriodicSlot.objects.filter(name__in=names)}
        for row in rows:
            setattr(row, ROW_EXTRA, states)

    def _state(self, obj: PeriodicRegistration) -> PeriodicSlot | None:
        states = row_extra(obj)
        if states is None:
            states = {s.name: s for s in PeriodicSlot.objects.filter(name=obj.name)}
        state: PeriodicSlot | None = states.get(obj.name)
        return state

    @admin.display(description="schedule")
    def schedule(self, obj: PeriodicRegistration) -> str:
        return _schedule_text(obj.definition)

    @admin.display(description="enabled")
    def enabled(self, obj: PeriodicRegistration) -> SafeString:
        """Say whether the leader inserts its slots; a disabled job says since when."""
        state = self._state(obj)
        if state is None or state.disabled_at is None:
            return mark_safe("yes")
        return format_html(
            '<strong class="hopper-paused">disabled</strong> since {}', time_text(state.disabled_at)
        )

    @admin.display(description="last slot")
    def last_slot(self, obj: PeriodicRegistration) -> str:
        state = self._state(obj)
        return time_text(state.last_slot) if state is not None else EMPTY

    # -- actions ------------------------------------------------------------

    def _names(self, queryset: QuerySet[Any]) -> list[str]:
        """Return the selected jobs' names, once each (several clients register one name)."""
        return sorted(set(queryset.values_list("name", flat=True)))

    @admin.action(description="Run selected periodic jobs now", permissions=("operate",))
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Insert each job's run now (a due slot becomes the run: no double fire)."""
        outcomes = Outcomes("run now", "periodic job")
        names = self._names(queryset)
        for name in names:
            try:
                result = periodic.run_periodic_now(name)
            except HopperError as exc:
                outcomes.refuse(type(exc).__name__, f"{name}: {exc}")
                continue
            if not result.inserted:
                outcomes.add("already waiting or running")
            elif result.slot is not None:
                outcomes.add("started as the due slot")
            else:
                outcomes.add("started")
        self.report(request, outcomes, names[0] if len(names) == 1 else None)

    @admin.action(description="Disable selected periodic jobs", permissions=("operate",))
    def disable(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        outcomes = Outcomes("disable", "periodic job")
        self._apply_each(
            request, self._names(queryset), periodic.disable_periodic, outcomes, "disabled"
        )

    @admin.action(
        description="Enable selected periodic jobs (from their next slot)",
        permissions=("operate",),
    )
    def enable(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        outcomes = Outcomes("enable", "periodic job")
        self._apply_each(
            request, self._names(queryset), periodic.enable_periodic, outcomes, "enabled"
        )

    @admin.display(description="next run")
    def next_run(self, obj: PeriodicRegistration) -> str:
        """Show the next slot of the schedule after now (the leader inserts it when due)."""
        state = self._state(obj)
        if state is not None and state.disabled_at is not None:
            return "none (disabled)"
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
    """Per periodic job: the last slot inserted, the job it inserted, and whether an
    operator disabled it (a job disabled before its first slot has no last slot)."""

    list_display = ("name", "last_slot_time", "inserted", "job", "disabled", "enabled")
    search_fields = ("name",)
    ordering = ("name",)
    fields = ("name", "last_slot_time", "inserted", "job", "disabled", "enabled")
    readonly_fields = fields

    last_slot_time = time_column("last_slot", "last slot")
    inserted = time_column("inserted_at", "inserted at")
    disabled = time_column("disabled_at", "disabled at")
    enabled = time_column("enabled_at", "enabled at")

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
