"""The Django admin for hopper: live jobs, history, queues, clients and the leader.

Everything here is read-only through the ORM. The actions (retry, cancel,
delete) call :mod:`django_hopper.api`, the functions user code calls, so that
a rule such as "a running job cannot be deleted" is written once, in the
engine, and the admin can never take a shortcut around it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_hopper import api
from django_hopper.engine.base import AttemptError, Progress
from django_hopper.exceptions import HopperError
from django_hopper.models import Client, Job, JobHistory, Leader, Queue

EMPTY = "-"


def _pretty(value: Any) -> SafeString:
    """Render a JSON value indented in a <pre>, escaped."""
    if value is None or value == {} or value == []:
        return mark_safe(EMPTY)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="hopper-json">{}</pre>', text)


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that shows rows and never writes them through the ORM.

    Hopper's tables are written by the engine (with fences and notifications
    the ORM knows nothing of); a form save or a bulk delete would bypass them.
    """

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class JobAdminBase(ReadOnlyAdmin):
    """What the live and the history job admins share."""

    list_display: tuple[str, ...] = (
        "id",
        "kind",
        "queue",
        "state",
        "priority",
        "attempts",
        "scheduled_at",
        "attempted_at",
    )
    list_filter = ("state", "queue", "kind")
    search_fields = ("kind",)
    search_help_text = "A job ID (exact), or part of a kind."
    ordering = ("-id",)  # UUIDv7: newest first
    list_per_page = 50
    show_full_result_count = False  # a COUNT(*) of a big history table is slow
    actions = ("retry_jobs", "cancel_jobs", "delete_jobs")
    fieldsets: Any = (
        (None, {"fields": ("id", "kind", "queue", "state", "priority", "attempts")}),
        (
            "Times",
            {
                "fields": (
                    "created_at",
                    "scheduled_at",
                    "attempted_at",
                    "expires_at",
                    "cancel_requested_at",
                )
            },
        ),
        ("Input", {"fields": ("args_pretty", "metadata_pretty", "tags", "keys")}),
        ("Run", {"fields": ("attempted_by", "fence", "snooze_reason", "progress_pretty")}),
        ("Errors and logs", {"fields": ("errors_pretty", "logs_pretty")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        """Make every shown field read-only, so the detail page is a view."""
        names: list[str] = []
        for _, opts in self.get_fieldsets(request, obj):
            names.extend(opts["fields"])
        return names

    # -- search -----------------------------------------------------------

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Find a job by its exact ID when the term is a UUID, else by kind."""
        term = search_term.strip()
        try:
            job_id = uuid.UUID(term)
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(id=job_id), False

    # -- columns and fields -----------------------------------------------

    @admin.display(description="attempts")
    def attempts(self, obj: Job | JobHistory) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    @admin.display(description="args")
    def args_pretty(self, obj: Job | JobHistory) -> SafeString:
        return _pretty(obj.args)

    @admin.display(description="metadata")
    def metadata_pretty(self, obj: Job | JobHistory) -> SafeString:
        return _pretty(obj.metadata)

    @admin.display(description="unique / ordering / partition key")
    def keys(self, obj: Job | JobHistory) -> str:
        return " / ".join(k or EMPTY for k in (obj.unique_key, obj.ordering_key, obj.partition_key))

    @admin.display(description="progress")
    def progress_pretty(self, obj: Job | JobHistory) -> SafeString:
        progress = Progress.from_json(obj.progress)
        if progress is None:
            return mark_safe(EMPTY)
        at = progress.recorded_at.isoformat() if progress.recorded_at else EMPTY
        return format_html("step {} at {}{}", progress.step or EMPTY, at, _pretty(progress.cursor))

    @admin.display(description="errors")
    def errors_pretty(self, obj: Job | JobHistory) -> SafeString:
        """Show each attempt's error, newest first, with its trace."""
        entries = [AttemptError.from_json(e) for e in (obj.errors or []) if isinstance(e, dict)]
        if not entries:
            return mark_safe(EMPTY)
        return format_html_join(
            "",
            "<div><strong>attempt {} at {}{}</strong>: {}<pre>{}</pre></div>",
            (
                (
                    e.attempt,
                    e.at.isoformat() if e.at else EMPTY,
                    f" ({e.rescue})" if e.rescue else "",
                    e.error,
                    e.trace,
                )
                for e in reversed(entries)
            ),
        )

    @admin.display(description="attempt logs")
    def logs_pretty(self, obj: Job | JobHistory) -> SafeString:
        """Show the attempt logs, read through the api (they live in their own table)."""
        try:
            logs = api.job_logs(obj.id)
        except HopperError as exc:
            return format_html("<em>logs unavailable: {}</em>", exc)
        if not logs:
            return mark_safe(EMPTY)
        return format_html_join(
            "",
            "<div><strong>attempt {}{}</strong><pre>{}</pre></div>",
            ((log.attempt, " (snoozed)" if log.snoozed else "", log.log) for log in logs),
        )

    # -- actions ------------------------------------------------------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Allow the actions to users who may change the model (the admin itself never does)."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        action: Callable[[uuid.UUID], Any],
        verb: str,
    ) -> None:
        """Call an api function per selected job; report each failure, then the count."""
        done = 0
        for job_id in queryset.values_list("id", flat=True):
            try:
                action(job_id)
            except HopperError as exc:
                self.message_user(
                    request,
                    f"Could not {verb} job {job_id}: {type(exc).__name__}: {exc}",
                    messages.ERROR,
                )
            else:
                done += 1
        if done:
            self.message_user(request, f"{verb.capitalize()}: {done} job(s).", messages.SUCCESS)

    @admin.action(description="Retry selected jobs now", permissions=("operate",))
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._apply(request, queryset, api.retry_job, "retry")

    @admin.action(description="Cancel selected jobs", permissions=("operate",))
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._apply(request, queryset, api.cancel_job, "cancel")

    @admin.action(description="Delete selected jobs", permissions=("operate",))
    def delete_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._apply(request, queryset, api.delete_job, "delete")


@admin.register(Job)
class JobAdmin(JobAdminBase):
    """Live jobs: pending, available, scheduled, retryable and running."""


@admin.register(JobHistory)
class JobHistoryAdmin(JobAdminBase):
    """Finished jobs: completed, canceled and discarded."""

    list_display = (
        "id",
        "kind",
        "queue",
        "state",
        "priority",
        "attempts",
        "scheduled_at",
        "finalized_at",
    )
    fieldsets = (
        *JobAdminBase.fieldsets[:1],
        (
            "Times",
            {"fields": ("created_at", "scheduled_at", "attempted_at", "finalized_at")},
        ),
        *JobAdminBase.fieldsets[2:],
        ("Result", {"fields": ("output_pretty",)}),
    )

    @admin.display(description="output")
    def output_pretty(self, obj: JobHistory) -> SafeString:
        return _pretty(obj.output)


@admin.register(Queue)
class QueueAdmin(ReadOnlyAdmin):
    """Known queues, whether they are paused, and their limits."""

    list_display = (
        "name",
        "paused",
        "paused_at",
        "global_limit",
        "rate_per_sec",
        "partition_limit",
        "updated_at",
    )
    list_filter = (("paused_at", admin.EmptyFieldListFilter),)
    search_fields = ("name",)
    ordering = ("name",)

    @admin.display(boolean=True, description="paused")
    def paused(self, obj: Queue) -> bool:
        return obj.paused_at is not None


@admin.register(Client)
class ClientAdmin(ReadOnlyAdmin):
    """Worker processes and their leases; an expired lease means the client is fenced."""

    list_display = ("id", "hostname", "started_at", "expires_at")
    search_fields = ("hostname",)
    ordering = ("-id",)
    readonly_fields = ("id", "hostname", "started_at", "expires_at", "info_pretty")
    fields = readonly_fields

    @admin.display(description="info")
    def info_pretty(self, obj: Client) -> SafeString:
        return _pretty(obj.info)


@admin.register(Leader)
class LeaderAdmin(ReadOnlyAdmin):
    """The leader lease: which client runs the maintenance services."""

    list_display = ("name", "client_id", "elected_at", "expires_at")
    ordering = ("name",)
