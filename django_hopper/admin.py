"""The Django admin for hopper: jobs live and in history, queues, batches and
workflows, clients and the leader, periodic jobs.

Everything here is read-only through the ORM. The actions (retry, cancel,
delete, pause, resume, set limits) call :mod:`django_hopper.api` and
:mod:`django_hopper.queues`, the functions user code calls, so that a rule such
as "a running job cannot be deleted" is written once, in the engine, and the
admin can never take a shortcut around it. What the admin shows and does is
described in docs/admin.md.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, ExpressionWrapper, Model, Q, QuerySet
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_hopper import api, queues
from django_hopper.engine.base import AttemptError, Progress, QueueStats, Stats
from django_hopper.exceptions import HopperError, InvalidJob
from django_hopper.models import (
    FINAL_STATES,
    Batch,
    Client,
    Job,
    JobDependency,
    JobHistory,
    Leader,
    PeriodicRegistration,
    PeriodicSlot,
    Queue,
)

EMPTY = "-"


def _pretty(value: Any) -> SafeString:
    """Render a JSON value indented in a <pre>, escaped."""
    if value is None or value == {} or value == []:
        return mark_safe(EMPTY)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="hopper-json">{}</pre>', text)


#: Where a changelist keeps what it read once for all its rows (stats, job states).
ROW_EXTRA = "_hopper_admin_extra"


def _extra(obj: Model) -> Any:
    """Return what the changelist attached to a row (see ``annotate_rows``), or None."""
    return getattr(obj, ROW_EXTRA, None)


def _extra_or_read(obj: Model, read: Callable[[], Any]) -> Any:
    """Return what the changelist attached to a row, or read it (the detail page) and attach it."""
    extra = _extra(obj)
    if extra is None:
        extra = read()
        setattr(obj, ROW_EXTRA, extra)
    return extra


def _admin_url(model: str, view: str, *args: Any) -> str:
    """Return the URL of one of this app's admin views, quoting primary keys as Django does."""
    return reverse(f"admin:django_hopper_{model}_{view}", args=[quote(a) for a in args])


def _job_url(job_id: uuid.UUID, state: str) -> str:
    """Return the admin page of a job: history for finished states, live otherwise."""
    return _admin_url("jobhistory" if state in FINAL_STATES else "job", "change", job_id)


def _job_refs(ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, tuple[str, str | None]]:
    """Return (state, step) of each job found, live first, then history: two queries at most.

    A job moves from live to history when it finishes, so the page it lives
    on is only known by looking; jobs in neither (deleted, or past retention)
    are left out.
    """
    wanted = set(ids)
    if not wanted:
        return {}
    refs: dict[uuid.UUID, tuple[str, str | None]] = {
        i: (state, step)
        for i, state, step in Job.objects.filter(id__in=wanted).values_list("id", "state", "step")
    }
    rest = wanted - refs.keys()
    if rest:
        rows = JobHistory.objects.filter(id__in=rest).values_list("id", "state", "step")
        refs.update({i: (state, step) for i, state, step in rows})
    return refs


def _job_link(job_id: uuid.UUID | None, state: str | None, label: str | None = None) -> SafeString:
    """Link a job to its admin page with its state, or say it is gone."""
    if job_id is None:
        return mark_safe(EMPTY)
    if state is None:
        return format_html("{} <em>(gone)</em>", label or job_id)
    return format_html('<a href="{}">{}</a> ({})', _job_url(job_id, state), label or job_id, state)


def _client_link(client_id: Any) -> SafeString:
    """Link a client's admin page."""
    return format_html('<a href="{}">{}</a>', _admin_url("client", "change", client_id), client_id)


def _seconds_text(value: dt.timedelta | float | None) -> str:
    """Render a duration in seconds, or the empty marker."""
    if value is None:
        return EMPTY
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    return f"{seconds:g}s"


def _stats(model_admin: admin.ModelAdmin, request: HttpRequest) -> Stats:
    """Read the cluster's stats once for a page; on failure say so and show no depths."""
    try:
        return queues.stats()
    except (HopperError, NotImplementedError) as exc:
        model_admin.message_user(request, f"Stats unavailable: {exc}", messages.WARNING)
        return Stats()


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

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Allow the actions to users who may change the model (the admin itself never does)."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def _apply_each(
        self,
        request: HttpRequest,
        keys: Iterable[Any],
        action: Callable[[Any], Any],
        failure: Callable[[Any, HopperError], str],
        success: Callable[[int], str],
    ) -> None:
        """Call an api function per selected key; report each failure, then the count."""
        done = 0
        for key in keys:
            try:
                action(key)
            except HopperError as exc:
                self.message_user(request, failure(key, exc), messages.ERROR)
            else:
                done += 1
        if done:
            self.message_user(request, success(done), messages.SUCCESS)

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach to the page's rows what they show beyond their columns, read once.

        Called with the rows of one changelist page; reading per row would
        cost a query (or a full stats read) per row.
        """

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """Build the changelist, then let ``annotate_rows`` read once for its page."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)  # evaluates (and caches) the page's queryset
        if rows:
            self.annotate_rows(request, rows)
        return changelist


class FieldsetsViewAdmin(ReadOnlyAdmin):
    """A read-only admin whose detail page shows its fieldsets, every field read-only."""

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        """Make every shown field read-only, so the detail page is a view."""
        return [f for _, opts in self.get_fieldsets(request, obj) for f in opts["fields"]]


class UUIDSearchMixin:
    """Search by exact ID when the term is a UUID, else by the admin's search fields."""

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        try:
            object_id = uuid.UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)  # type: ignore[misc]
        return queryset.filter(id=object_id), False


class JobAdminBase(UUIDSearchMixin, FieldsetsViewAdmin):
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

    def get_fieldsets(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """Add the batch and workflow section to jobs that belong to one."""
        fieldsets = list(super().get_fieldsets(request, obj))
        if isinstance(obj, Job | JobHistory) and (obj.batch_id or obj.step):
            fieldsets.insert(
                1,
                (
                    "Batch and workflow",
                    {"fields": ("batch_link", "step", "dependencies", "dependents")},
                ),
            )
        return fieldsets

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

    @admin.display(description="batch / workflow")
    def batch_link(self, obj: Job | JobHistory) -> SafeString:
        """Link the job's batch, saying whether it is a workflow (and its name)."""
        if obj.batch_id is None:
            return mark_safe(EMPTY)
        batch = Batch.objects.filter(id=obj.batch_id).only("id", "name", "is_workflow").first()
        if batch is None:
            return format_html("{} <em>(gone)</em>", obj.batch_id)
        what = f"workflow {batch.name}" if batch.is_workflow else "batch"
        return format_html(
            '<a href="{}">{} {}</a>', _admin_url("batch", "change", batch.id), what, batch.id
        )

    def _edges(self, pairs: list[tuple[uuid.UUID, str, bool]]) -> SafeString:
        """Render (job, on_failure, reads) edges as links to the jobs, with their steps."""
        if not pairs:
            return mark_safe(EMPTY)
        refs = _job_refs(other for other, _, _ in pairs)
        items = []
        for other, on_failure, reads in pairs:
            state, step = refs.get(other, (None, None))
            label = f"{step} {other}" if step else str(other)
            items.append((_job_link(other, state, label), on_failure, ", reads" if reads else ""))
        return format_html_join(mark_safe("<br>"), "{} &middot; on failure: {}{}", items)

    @admin.display(description="runs after")
    def dependencies(self, obj: Job | JobHistory) -> SafeString:
        """Show the jobs this one waits for, each with the edge's failure policy."""
        rows = JobDependency.objects.filter(job_id=obj.id).order_by("id")
        return self._edges([(r.depends_on, r.on_failure, r.reads) for r in rows])

    @admin.display(description="runs before")
    def dependents(self, obj: Job | JobHistory) -> SafeString:
        """Show the jobs that wait for this one."""
        rows = JobDependency.objects.filter(depends_on=obj.id).order_by("id")
        return self._edges([(r.job_id, r.on_failure, r.reads) for r in rows])

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

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        action: Callable[[uuid.UUID], Any],
        verb: str,
    ) -> None:
        """Call an api function per selected job; report each failure, then the count."""
        self._apply_each(
            request,
            queryset.values_list("id", flat=True),
            action,
            failure=lambda job_id, exc: (
                f"Could not {verb} job {job_id}: {type(exc).__name__}: {exc}"
            ),
            success=lambda done: f"{verb.capitalize()}: {done} job(s).",
        )

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


# -- queues -----------------------------------------------------------------


class QueueLimitsForm(forms.Form):
    """The five limits of a queue. Blank or zero removes one.

    The form checks types only: what a valid limit is (non-negative, a burst
    with a rate ...) is decided by ``set_queue_limits``, whose InvalidJob
    becomes the error of the field it names.
    """

    rate_per_sec = forms.FloatField(
        required=False, label="Rate (jobs per second)", help_text="Claims per second, all workers."
    )
    burst = forms.IntegerField(
        required=False, help_text="Tokens of the rate's bucket; blank: one second's worth."
    )
    global_limit = forms.IntegerField(required=False, help_text="Running jobs, all workers.")
    partition_limit = forms.IntegerField(
        required=False, help_text="Running jobs per partition key, all workers."
    )
    aging = forms.FloatField(
        required=False,
        label="Aging (seconds)",
        help_text="A waiting job gains one priority level per interval waited.",
    )

    #: InvalidJob.field names that are not this form's field names.
    API_FIELDS = {"rate_burst": "burst"}

    @classmethod
    def initial_for(cls, queue: Queue) -> dict[str, Any]:
        """Return the form's initial values from a queue row (unset limits blank)."""
        return {
            "rate_per_sec": queue.rate_per_sec or None,
            "burst": queue.rate_burst or None,
            "global_limit": queue.global_limit or None,
            "partition_limit": queue.partition_limit or None,
            "aging": queue.aging.total_seconds() if queue.aging else None,
        }

    def apply(self, name: str) -> bool:
        """Set the limits through the api; turn its refusal into form errors, return success."""
        data = self.cleaned_data
        try:
            queues.set_queue_limits(
                name,
                rate_per_sec=data["rate_per_sec"] or 0,
                burst=data["burst"],
                global_limit=data["global_limit"] or 0,
                partition_limit=data["partition_limit"] or 0,
                aging=data["aging"] or 0,
            )
        except InvalidJob as exc:
            field = self.API_FIELDS.get(exc.field or "", exc.field)
            self.add_error(field if field in self.fields else None, str(exc))
            return False
        except HopperError as exc:
            self.add_error(None, f"{type(exc).__name__}: {exc}")
            return False
        return True


@admin.register(Queue)
class QueueAdmin(FieldsetsViewAdmin):
    """Known queues: paused or not, their limits and live depths; pause, resume, limits."""

    list_display = (
        "name",
        "paused",
        "available",
        "scheduled",
        "retryable",
        "running",
        "global_limit",
        "rate",
        "partition_limit",
        "aging_text",
        "limits_link",
        "updated_at",
    )
    list_filter = (("paused_at", admin.EmptyFieldListFilter),)
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("pause_queues", "resume_queues", "set_limits")
    fieldsets = (
        (None, {"fields": ("name", "paused", "paused_at", "created_at", "updated_at")}),
        ("Depths", {"fields": ("depths",)}),
        (
            "Limits",
            {
                "fields": (
                    "global_limit",
                    "rate",
                    "partition_limit",
                    "aging_text",
                    "limits_link",
                )
            },
        ),
    )

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach each queue's depths from one stats read for the whole page."""
        stats = _stats(self, request)
        for queue in rows:
            setattr(queue, ROW_EXTRA, stats.queues.get(queue.name, QueueStats()))

    def _depths(self, obj: Queue) -> QueueStats:
        """Return the depths attached by the changelist, or read them (the detail page)."""
        depths: QueueStats = _extra_or_read(
            obj, lambda: queues.stats().queues.get(obj.name, QueueStats())
        )
        return depths

    @admin.display(boolean=True, description="paused")
    def paused(self, obj: Queue) -> bool:
        return obj.paused_at is not None

    @admin.display(description="available")
    def available(self, obj: Queue) -> int:
        return self._depths(obj).available

    @admin.display(description="scheduled")
    def scheduled(self, obj: Queue) -> int:
        return self._depths(obj).scheduled

    @admin.display(description="retryable")
    def retryable(self, obj: Queue) -> int:
        return self._depths(obj).retryable

    @admin.display(description="running")
    def running(self, obj: Queue) -> int:
        return self._depths(obj).running

    @admin.display(description="depths")
    def depths(self, obj: Queue) -> str:
        d = self._depths(obj)
        return (
            f"available {d.available}, scheduled {d.scheduled}, retryable {d.retryable}, "
            f"running {d.running}; oldest available waited "
            f"{_seconds_text(d.oldest_available)}; completed in the last minute "
            f"{d.completed_last_minute}"
        )

    @admin.display(description="rate limit")
    def rate(self, obj: Queue) -> str:
        if not obj.rate_per_sec:
            return EMPTY
        burst = f", burst {obj.rate_burst}" if obj.rate_burst else ""
        return f"{obj.rate_per_sec:g}/s{burst}"

    @admin.display(description="aging")
    def aging_text(self, obj: Queue) -> str:
        return _seconds_text(obj.aging) if obj.aging else EMPTY

    @admin.display(description="limits")
    def limits_link(self, obj: Queue) -> SafeString:
        return format_html('<a href="{}">set limits</a>', _admin_url("queue", "limits", obj.pk))

    # -- actions ------------------------------------------------------------

    def _apply(
        self, request: HttpRequest, queryset: QuerySet[Any], action: Callable[[str], Any], verb: str
    ) -> None:
        """Call a queues function per selected queue; report each failure, then the count."""
        self._apply_each(
            request,
            queryset.values_list("name", flat=True),
            action,
            failure=lambda name, exc: f"Could not {verb} queue {name}: {exc}",
            success=lambda done: f"{verb.capitalize()}d: {done} queue(s).",
        )

    @admin.action(description="Pause selected queues", permissions=("operate",))
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._apply(request, queryset, queues.pause_queue, "pause")

    @admin.action(description="Resume selected queues", permissions=("operate",))
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._apply(request, queryset, queues.resume_queue, "resume")

    @admin.action(description="Set limits of the selected queue", permissions=("operate",))
    def set_limits(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponseRedirect | None:
        """Open the limits form of the one selected queue (limits differ per queue)."""
        names = list(queryset.values_list("name", flat=True)[:2])
        if len(names) != 1:
            self.message_user(request, "Select exactly one queue to set limits.", messages.WARNING)
            return None
        return HttpResponseRedirect(_admin_url("queue", "limits", names[0]))

    # -- the limits form ------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        limits = path(
            "<path:object_id>/limits/",
            self.admin_site.admin_view(self.limits_view),
            name=f"{opts.app_label}_{opts.model_name}_limits",
        )
        return [limits, *super().get_urls()]

    def limits_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Show a queue's limits in a form and set them through ``set_queue_limits``."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        queue = self.get_object(request, unquote(object_id))
        if queue is None:
            raise Http404(f"no queue {unquote(object_id)!r}")
        if request.method == "POST":
            form = QueueLimitsForm(request.POST)
            if form.is_valid() and form.apply(queue.name):
                self.message_user(request, f"Limits of queue {queue.name} set.", messages.SUCCESS)
                return HttpResponseRedirect(_admin_url("queue", "changelist"))
        else:
            form = QueueLimitsForm(initial=QueueLimitsForm.initial_for(queue))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Limits of queue {queue.name}",
            "queue": queue,
            "form": form,
        }
        return TemplateResponse(request, "admin/django_hopper/queue/limits.html", context)


# -- batches and workflows ----------------------------------------------------


class BatchCompletedFilter(admin.SimpleListFilter):
    """Filter batches on whether every job has finished (and the callbacks were inserted)."""

    title = "completed"
    parameter_name = "completed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "completed"), ("no", "open")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(completed_at__isnull=self.value() == "no")
        return queryset


@admin.register(Batch)
class BatchAdmin(UUIDSearchMixin, FieldsetsViewAdmin):
    """Batches and workflows: progress, callbacks, metadata, and a workflow's graph."""

    list_display = (
        "id",
        "name",
        "is_workflow",
        "total",
        "pending",
        "failed",
        "completed_at",
        "created_at",
    )
    list_filter = (BatchCompletedFilter, "is_workflow")
    search_fields = ("name",)
    search_help_text = "A batch or workflow ID (exact), or part of a workflow's name."
    ordering = ("-id",)  # UUIDv7: newest first
    list_per_page = 50
    show_full_result_count = False
    fieldsets: Any = (
        (None, {"fields": ("id", "name", "is_workflow", "created_at", "completed_at")}),
        ("Progress", {"fields": ("progress", "jobs_links")}),
        ("Callbacks", {"fields": ("on_success_pretty", "on_failure_pretty", "on_complete_pretty")}),
        ("Metadata", {"fields": ("metadata_pretty",)}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """Add the steps and edges of a workflow."""
        if isinstance(obj, Batch) and obj.is_workflow:
            return (*self.fieldsets, ("Steps", {"fields": ("workflow_steps",)}))
        return self.fieldsets

    @admin.display(description="progress")
    def progress(self, obj: Batch) -> str:
        """Show progress as the api reads it: the finishes not yet folded counted in."""
        from django_hopper.batches import get_batch

        try:
            row = get_batch(obj.id)
        except HopperError as exc:
            return f"progress unavailable: {exc}"
        done = row.total - row.pending
        state = "completed" if row.completed_at else "open"
        return (
            f"{state}: {done} of {row.total} finished ({row.failed} canceled or discarded), "
            f"{row.pending} pending"
        )

    @admin.display(description="jobs")
    def jobs_links(self, obj: Batch) -> SafeString:
        """Link the batch's jobs in the live and the history lists."""
        live = _admin_url("job", "changelist") + f"?batch_id={obj.id}"
        done = _admin_url("jobhistory", "changelist") + f"?batch_id={obj.id}"
        return format_html(
            '<a href="{}">live jobs</a> &middot; <a href="{}">finished</a>', live, done
        )

    @staticmethod
    def _callback(params: Any) -> SafeString:
        """Show a callback's kind and queue, then its stored insert params."""
        if not isinstance(params, dict):
            return mark_safe(EMPTY)
        return format_html(
            "{} on queue {}{}", params.get("kind", "?"), params.get("queue", "?"), _pretty(params)
        )

    @admin.display(description="on success")
    def on_success_pretty(self, obj: Batch) -> SafeString:
        return self._callback(obj.on_success)

    @admin.display(description="on failure")
    def on_failure_pretty(self, obj: Batch) -> SafeString:
        return self._callback(obj.on_failure)

    @admin.display(description="on complete")
    def on_complete_pretty(self, obj: Batch) -> SafeString:
        return self._callback(obj.on_complete)

    @admin.display(description="metadata")
    def metadata_pretty(self, obj: Batch) -> SafeString:
        return _pretty(obj.metadata)

    @admin.display(description="steps")
    def workflow_steps(self, obj: Batch) -> SafeString:
        """Show each job of the workflow (step, state, link) and the jobs it runs after."""
        from django_hopper.workflows import get_workflow

        try:
            wf = get_workflow(obj.id)
        except HopperError as exc:
            return format_html("<em>workflow unavailable: {}</em>", exc)
        states = {j.id: j.state for j in wf.jobs}

        def label(job_id: uuid.UUID) -> str:
            return wf.steps.get(job_id) or str(job_id)

        def after(job_id: uuid.UUID) -> SafeString:
            edges = [e for e in wf.edges if e.job == job_id]
            if not edges:
                return mark_safe(EMPTY)
            return format_html_join(
                mark_safe("<br>"),
                "{} &middot; on failure: {}{}",
                (
                    (
                        _job_link(e.depends_on, states.get(e.depends_on), label(e.depends_on)),
                        e.on_failure,
                        ", reads" if e.reads else "",
                    )
                    for e in edges
                ),
            )

        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    wf.steps.get(j.id) or EMPTY,
                    _job_link(j.id, j.state),
                    j.kind,
                    j.queue,
                    after(j.id),
                )
                for j in wf.jobs
            ),
        )
        return format_html(
            '<table class="hopper-steps"><thead><tr><th>step</th><th>job (state)</th>'
            "<th>kind</th><th>queue</th><th>runs after</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )


# -- periodic jobs --------------------------------------------------------------


def _schedule_text(definition: Any) -> str:
    """Describe a registered definition's schedule: its cron (and zone) or its interval."""
    if not isinstance(definition, dict):
        return EMPTY
    if definition.get("cron"):
        return f"cron {definition['cron']} ({definition.get('tz') or 'UTC'})"
    if definition.get("every"):
        return f"every {_seconds_text(definition['every'])}"
    return EMPTY


@admin.register(PeriodicRegistration)
class PeriodicRegistrationAdmin(ReadOnlyAdmin):
    """Periodic jobs as the live clients declare them; the leader inserts from these."""

    list_display = ("name", "schedule", "kind", "client", "short_digest", "registered_at")
    list_filter = ("name",)
    search_fields = ("name",)
    ordering = ("name", "client_id")
    fields = ("name", "schedule", "kind", "client", "digest", "registered_at", "definition_pretty")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """List only registrations of clients whose lease has not expired (by database time)."""
        live = Client.objects.filter(expires_at__gt=Now()).values("id")
        return super().get_queryset(request).filter(client_id__in=live)

    @admin.display(description="schedule")
    def schedule(self, obj: PeriodicRegistration) -> str:
        return _schedule_text(obj.definition)

    @admin.display(description="kind")
    def kind(self, obj: PeriodicRegistration) -> str:
        return str(obj.definition.get("kind", EMPTY)) if isinstance(obj.definition, dict) else EMPTY

    @admin.display(description="client", ordering="client_id")
    def client(self, obj: PeriodicRegistration) -> SafeString:
        return _client_link(obj.client_id)

    @admin.display(description="digest")
    def short_digest(self, obj: PeriodicRegistration) -> str:
        return obj.digest[:12]

    @admin.display(description="definition")
    def definition_pretty(self, obj: PeriodicRegistration) -> SafeString:
        return _pretty(obj.definition)


@admin.register(PeriodicSlot)
class PeriodicSlotAdmin(ReadOnlyAdmin):
    """The last slot inserted per periodic job, and the job it inserted."""

    list_display = ("name", "last_slot", "inserted_at", "job")
    search_fields = ("name",)
    ordering = ("name",)
    fields = ("name", "last_slot", "inserted_at", "job")
    readonly_fields = fields

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Find where each slot's job is (live or history) in two queries for the page."""
        refs = _job_refs(slot.job_id for slot in rows if slot.job_id)
        for slot in rows:
            setattr(slot, ROW_EXTRA, refs)

    @admin.display(description="job")
    def job(self, obj: PeriodicSlot) -> SafeString:
        if obj.job_id is None:
            return mark_safe(EMPTY)
        refs = _extra(obj)
        if refs is None:
            refs = _job_refs([obj.job_id])
        return _job_link(obj.job_id, refs.get(obj.job_id, (None, None))[0])


# -- clients and the leader -------------------------------------------------------


class LeaseAdmin(ReadOnlyAdmin):
    """A read-only admin of rows holding a lease, whose liveness is read by database time."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Read each lease's liveness by database time, the clock leases are granted by."""
        live = ExpressionWrapper(Q(expires_at__gt=Now()), output_field=BooleanField())
        return super().get_queryset(request).annotate(lease_live=live)

    @admin.display(boolean=True, description="lease live", ordering="expires_at")
    def live(self, obj: Client | Leader) -> bool:
        return bool(getattr(obj, "lease_live", False))


@admin.register(Client)
class ClientAdmin(LeaseAdmin):
    """Worker processes and their leases; an expired lease means the client is fenced."""

    list_display = ("id", "hostname", "live", "leads", "running", "started_at", "expires_at")
    search_fields = ("hostname",)
    ordering = ("-id",)
    readonly_fields = (
        "id",
        "hostname",
        "live",
        "leads",
        "running",
        "started_at",
        "expires_at",
        "info_pretty",
    )
    fields = readonly_fields

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach the leader and running counts from one stats read for the page."""
        stats = _stats(self, request)
        for client in rows:
            setattr(client, ROW_EXTRA, stats)

    def _cluster(self, obj: Client) -> Stats:
        stats: Stats = _extra_or_read(obj, queues.stats)
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
        url = _admin_url("job", "changelist") + f"?state=running&attempted_by={obj.id}"
        return format_html('<a href="{}">{}</a>', url, count)

    @admin.display(description="info")
    def info_pretty(self, obj: Client) -> SafeString:
        return _pretty(obj.info)


@admin.register(Leader)
class LeaderAdmin(LeaseAdmin):
    """The leader lease: which client runs the maintenance services."""

    list_display = ("name", "client", "live", "elected_at", "expires_at")
    ordering = ("name",)
    fields = list_display
    readonly_fields = fields

    @admin.display(description="client", ordering="client_id")
    def client(self, obj: Leader) -> SafeString:
        return _client_link(obj.client_id)
