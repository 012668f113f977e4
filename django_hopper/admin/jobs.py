"""The live and the history job admins: lists, the job page and the job actions."""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_hopper import api, topology
from django_hopper.admin.bulk import apply_in_chunks, count_into
from django_hopper.admin.common import (
    EMPTY,
    ROW_EXTRA,
    FieldsetsViewAdmin,
    Outcomes,
    admin_url,
    client_link,
    find_job,
    job_link,
    job_refs,
    job_url,
    on_alias,
    pretty,
    request_alias,
    row_alias,
    row_extra,
    row_extra_or_read,
    seconds_text,
    time_column,
    time_text,
)
from django_hopper.admin.decoded import DecodedChangeList, decoded_row
from django_hopper.admin.filters import DatabaseFilter, KindFilter, QueueFilter, StateFilter
from django_hopper.conf import hopper_settings
from django_hopper.engine import get_engine
from django_hopper.exceptions import HopperError
from django_hopper.jobs import registry
from django_hopper.models import (
    Batch,
    Job,
    JobDependency,
    JobHistory,
)
from django_hopper.types import (
    FINAL_STATES,
    LIVE_STATES,
    AttemptError,
    JobManyResult,
    JobState,
    Progress,
)


def _alias_of(obj: Model) -> str | None:
    """Return the alias a job row was read from, when hopper's jobs live there."""
    alias = obj._state.db
    return alias if alias in topology.aliases() else None


#: The alias a job row was read from when it is not ``DATABASE``, else None.
_other_alias = row_alias


class JobAdminBase(FieldsetsViewAdmin):
    """What the live and the history job admins share."""

    list_display: tuple[str, ...] = (
        "job_id",
        "kind_text",
        "queue",
        "state",
        "attempts",
        "scheduled",
        "attempted",
    )
    list_filter = (DatabaseFilter, StateFilter, QueueFilter, KindFilter)
    search_fields = ("kind",)  # shows the search box; get_search_results decides what matches
    search_help_text = (
        "A job ID (exact), a kind (exact), or part of a kind registered in this process."
    )
    ordering = ("-id",)  # UUIDv7: newest first
    #: Sort only by ID (creation order): every other sort would read the whole table.
    sortable_by = ("job_id",)
    list_per_page = 50
    #: The query parameters a page may filter by: each served by an index.
    FILTER_PARAMS = frozenset({"database", "state", "queue", "kind", "batch_id", "attempted_by"})
    actions: tuple[str, ...] = ("retry_jobs", "cancel_jobs", "delete_jobs")
    fieldsets: Any = (
        (None, {"fields": ("id", "kind", "queue", "state", "priority", "attempts")}),
        (
            "Times",
            {
                "fields": (
                    "created",
                    "scheduled",
                    "attempted",
                    "expires",
                    "cancel_requested",
                    "timeline",
                )
            },
        ),
        ("Input", {"fields": ("args_pretty", "metadata_pretty", "tags", "keys")}),
        ("Run", {"fields": ("held_by", "fence", "snooze_reason", "progress_pretty")}),
        ("Errors and logs", {"fields": ("errors_pretty", "logs_pretty")}),
    )

    created = time_column("created_at", "created at")
    scheduled = time_column("scheduled_at", "scheduled at")
    attempted = time_column("attempted_at", "attempted at")
    expires = time_column("expires_at", "expires at")
    cancel_requested = time_column("cancel_requested_at", "cancel requested at")

    # -- a page costs the same whatever the table's size -------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[DecodedChangeList]:
        """List through the engine's tolerant read: a row that does not decode is shown
        with its error, never a failed page."""
        return DecodedChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Read the alias the request names (``?database=``), else as the router says."""
        queryset = super().get_queryset(request)
        alias = request_alias(request)
        return queryset if alias is None else queryset.using(alias)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Allow filters an index serves; refuse the rest (a 400, never a full scan or a 500)."""
        return lookup in self.FILTER_PARAMS

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Find a job by exact ID, or by kind: exact, or part of a registered kind.

        Each is an equality on an indexed column (the primary key, or the
        ``(kind, id)`` index through an ``IN`` list): a ``LIKE '%term%'``
        would read every row of history.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(id=uuid.UUID(term)), False
        except ValueError:
            pass

        needle = term.lower()
        kinds = {term, *(kind for kind in registry if needle in kind.lower())}
        return queryset.filter(kind__in=sorted(kinds)), False

    change_form_template = "admin/django_hopper/job/change_form.html"

    def get_fieldsets(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """Add the batch and workflow section to jobs that belong to one, the
        data-subject section (first, so an erased job says so at the top) to jobs
        with a subject or erased, and before it a section saying why a job's stored
        values do not decode, when they do not."""
        fieldsets = list(super().get_fieldsets(request, obj))
        if isinstance(obj, Job | JobHistory) and (obj.subject or obj.erased_at):
            fieldsets.insert(0, ("Data subject", {"fields": ("subject", "erased")}))
        if isinstance(obj, Job | JobHistory) and self._decode_error(obj):
            fieldsets.insert(
                0, ("Stored values that do not decode", {"fields": ("decode_error_text",)})
            )
        if isinstance(obj, Job) and (
            obj.lease_expires_at or obj.lease_began_at or obj.admission_misses
        ):
            run = next(i for i, (title, _) in enumerate(fieldsets) if title == "Run")
            fieldsets.insert(
                run + 1, ("Lease", {"fields": ("lease_text", "pass_text", "admission_text")})
            )
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

    @admin.display(description="erased")
    def erased(self, obj: Job | JobHistory) -> str:
        """Say that the job's data was erased, and when; or that it was not."""
        if obj.erased_at is None:
            return "no"
        return (
            f"erased at {time_text(obj.erased_at)}: its arguments, metadata, tags, keys, "
            "errors, progress, output, step results and logs were removed (erase_subject)"
        )

    @admin.display(description="ID", ordering="id")
    def job_id(self, obj: Job | JobHistory) -> SafeString:
        """Show an ID short enough for one line: its first 8 and last 4 digits, the whole on hover.

        The first digits are the creation time (UUIDv7), the last are random;
        search takes the whole ID, which the job's page shows.
        """
        text = str(obj.id)
        return format_html('<span title="{}">{}&hellip;{}</span>', text, text[:8], text[-4:])

    @admin.display(description="kind")
    def kind_text(self, obj: Job | JobHistory) -> SafeString:
        """Show the kind, breakable after each dot so the column stays narrow, and under it
        why the row's stored values do not decode, if they do not."""
        kind = format_html_join(
            mark_safe(".<wbr>"), "{}", ((part,) for part in obj.kind.split("."))
        )
        error = row_extra(obj)
        if not error:
            return kind
        return format_html(
            '{}<span class="hopper-decode-error" title="{}">does not decode: {}</span>',
            kind,
            error,
            error if len(error) <= 120 else error[:117] + "...",
        )

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach each row's decode error, from one engine read of the page's jobs.

        The list's rows were read by the engine (``DecodedChangeList``), whose
        tolerant read names what is wrong (``JobRow.decode_error``), so the
        operator sees why a job failed with ``rescue="undecodable"`` or cannot
        run; a row without that read is read once more here.
        """
        decoded = {row.id: decoded_row(row) for row in rows}
        unread = [job_id for job_id, job in decoded.items() if job is None]
        errors = self._decode_errors(unread, _alias_of(rows[0])) if unread else {}
        for row in rows:
            job = decoded[row.id]
            setattr(row, ROW_EXTRA, (job.decode_error or "") if job else errors.get(row.id, ""))

    def _decode_error(self, obj: Job | JobHistory) -> str:
        """Return the job's decode error ("" if none): attached by the list, or read once."""
        error: str = row_extra_or_read(
            obj, lambda: self._decode_errors([obj.id], _alias_of(obj)).get(obj.id, "")
        )
        return error

    def _decode_errors(self, ids: list[uuid.UUID], alias: str | None) -> dict[uuid.UUID, str]:
        """Return the decode error of each of these jobs that has one (one query on the
        alias the rows were read from)."""
        if not ids:
            return {}
        states = LIVE_STATES if self.model is Job else FINAL_STATES
        try:
            found = api.list_jobs(ids=ids, states=states, limit=len(ids), using=alias)
        except HopperError:
            return {}
        return {job.id: job.decode_error for job in found if job.decode_error}

    @admin.display(description="does not decode")
    def decode_error_text(self, obj: Job | JobHistory) -> SafeString:
        """Say which stored values of this job do not decode, and why (the engine's read)."""
        error = self._decode_error(obj)
        if not error:
            return mark_safe(EMPTY)
        return format_html('<pre class="hopper-pre hopper-decode-error">{}</pre>', error)

    @admin.display(description="tries")
    def attempts(self, obj: Job | JobHistory) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    @admin.display(description="args")
    def args_pretty(self, obj: Job | JobHistory) -> SafeString:
        return pretty(obj.args)

    @admin.display(description="metadata")
    def metadata_pretty(self, obj: Job | JobHistory) -> SafeString:
        return pretty(obj.metadata)

    @admin.display(description="unique / ordering / partition key")
    def keys(self, obj: Job | JobHistory) -> str:
        return " / ".join(k or EMPTY for k in (obj.unique_key, obj.ordering_key, obj.partition_key))

    @admin.display(description="progress")
    def progress_pretty(self, obj: Job | JobHistory) -> SafeString:
        progress = Progress.from_json(obj.progress)
        if progress is None:
            return mark_safe(EMPTY)
        at = progress.recorded_at.isoformat() if progress.recorded_at else EMPTY
        return format_html("step {} at {}{}", progress.step or EMPTY, at, pretty(progress.cursor))

    @admin.display(description="batch / workflow")
    def batch_link(self, obj: Job | JobHistory) -> SafeString:
        """Link the job's batch, saying whether it is a workflow (and its name)."""
        if obj.batch_id is None:
            return mark_safe(EMPTY)
        alias = _other_alias(obj)
        batches = Batch.objects.all() if alias is None else Batch.objects.using(alias)
        batch = batches.filter(id=obj.batch_id).only("id", "name", "is_workflow").first()
        if batch is None:
            return format_html("{} <em>(gone)</em>", obj.batch_id)
        what = f"workflow {batch.name}" if batch.is_workflow else "batch"
        url = on_alias(admin_url("batch", "change", batch.id), alias)  # on the job's database
        return format_html('<a href="{}">{} {}</a>', url, what, batch.id)

    def _edges(self, pairs: list[tuple[uuid.UUID, str, bool]], alias: str | None) -> SafeString:
        """Render (job, on_failure, reads) edges as links to the jobs, with their steps."""
        if not pairs:
            return mark_safe(EMPTY)
        refs = job_refs((other for other, _, _ in pairs), alias)
        items = []
        for other, on_failure, reads in pairs:
            state, step = refs.get(other, (None, None))
            label = f"{step} {other}" if step else str(other)
            link = job_link(other, state, label, alias)
            items.append((link, on_failure, ", reads" if reads else ""))
        return format_html_join(mark_safe("<br>"), "{} &middot; on failure: {}{}", items)

    @admin.display(description="runs after")
    def dependencies(self, obj: Job | JobHistory) -> SafeString:
        """Show the jobs this one waits for, each with the edge's failure policy."""
        alias = _other_alias(obj)
        edges = JobDependency.objects.all() if alias is None else JobDependency.objects.using(alias)
        rows = edges.filter(job_id=obj.id).order_by("id")
        return self._edges([(r.depends_on, r.on_failure, r.reads) for r in rows], alias)

    @admin.display(description="runs before")
    def dependents(self, obj: Job | JobHistory) -> SafeString:
        """Show the jobs that wait for this one."""
        alias = _other_alias(obj)
        edges = JobDependency.objects.all() if alias is None else JobDependency.objects.using(alias)
        rows = edges.filter(depends_on=obj.id).order_by("id")
        return self._edges([(r.job_id, r.on_failure, r.reads) for r in rows], alias)

    @admin.display(description="errors")
    def errors_pretty(self, obj: Job | JobHistory) -> SafeString:
        """Show each attempt's error, newest first, with its trace."""
        entries = [AttemptError.from_json(e) for e in (obj.errors or []) if isinstance(e, dict)]
        if not entries:
            return mark_safe(EMPTY)
        return format_html_join(
            "",
            '<div class="hopper-error"><strong>attempt {} at {}{}</strong>: '
            '<pre class="hopper-pre">{}\n{}</pre></div>',
            (
                (
                    e.attempt,
                    time_text(e.at),
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
            logs = api.job_logs(obj.id, using=_alias_of(obj))
        except HopperError as exc:
            return format_html("<em>logs unavailable: {}</em>", exc)
        if not logs:
            return mark_safe(EMPTY)
        return format_html_join(
            "",
            '<div><strong>attempt {}{}</strong><pre class="hopper-pre">{}</pre></div>',
            ((log.attempt, " (snoozed)" if log.snoozed else "", log.log) for log in logs),
        )

    @admin.display(description="held by")
    def held_by(self, obj: Job | JobHistory) -> SafeString | str:
        """Say who runs the job: a worker's client, or a job lease (a claim by ID, no client)."""
        if obj.attempted_by is not None:
            return client_link(obj.attempted_by, _other_alias(obj))
        if isinstance(obj, Job) and obj.state == JobState.RUNNING and obj.lease_expires_at:
            return "a job lease (claimed by ID: a request, command or cron holds it, no worker)"
        return EMPTY

    def _database_now(self, obj: Job) -> dt.datetime:
        """Return the database's time, once per page: leases expire by it, not by this clock."""
        now: dt.datetime | None = getattr(obj, "_hopper_now", None)
        if now is None:
            now = get_engine(_alias_of(obj)).now()
            obj._hopper_now = now  # type: ignore[attr-defined]
        return now

    @admin.display(description="lease")
    def lease_text(self, obj: Job) -> str:
        """Show until when the job's lease holds (by database time), and its last renewal."""
        if obj.lease_expires_at is None:
            return EMPTY
        now = self._database_now(obj)
        left = round((obj.lease_expires_at - now).total_seconds())
        if left >= 0:
            until = f"until {time_text(obj.lease_expires_at)} (in {left}s)"
        else:
            until = (
                f"expired at {time_text(obj.lease_expires_at)} ({-left}s ago): the leader's "
                "lease expiry ends the attempt"
            )
        holder = "worker's pass" if obj.attempted_by is not None else "job lease"
        renewed = f", renewed at {time_text(obj.lease_renewed_at)}" if obj.lease_renewed_at else ""
        return f"{holder} {until}{renewed}"

    @admin.display(description="pass")
    def pass_text(self, obj: Job) -> str:
        """Say whether the resumable run's current pass BEGAN (only then is it charged)."""
        if obj.lease_began_at is not None:
            return f"began at {time_text(obj.lease_began_at)}"
        if obj.state == JobState.RUNNING:
            return "not begun: claimed, not yet committed to running a pass"
        return EMPTY

    @admin.display(description="admission misses")
    def admission_text(self, obj: Job) -> str:
        """Count the run's consecutive claims that did not begin their pass, against the bound."""
        misses = obj.admission_misses or 0
        if not misses:
            return "none"
        bound = int(hopper_settings.ADMISSION_MISS_MAX)
        return (
            f"{misses} of {bound}: consecutive claims that did not begin their pass "
            f"(at {bound} the run is discarded; the snooze reason says why)"
        )

    @admin.display(description="timeline")
    def timeline(self, obj: Job | JobHistory) -> SafeString:
        """Show the job's life: enqueued, each attempt's end, the current attempt, the finish.

        Each failed attempt left its error (with its time); the last attempt's
        start and client are on the row; durations are between those times.
        """
        entries = [AttemptError.from_json(e) for e in (obj.errors or []) if isinstance(e, dict)]
        events: list[tuple[dt.datetime | None, int, str, str]] = [
            (obj.created_at, 0, "enqueued", f"scheduled for {time_text(obj.scheduled_at)}")
        ]
        for e in entries:
            what = f"attempt {e.attempt} ended: {e.rescue or 'failed'}"
            events.append((e.at, 2, what, e.error.splitlines()[0] if e.error else ""))
        if obj.attempted_at is not None:
            if obj.attempted_by is not None:
                by = f"by client {obj.attempted_by}"
            elif isinstance(obj, Job) and obj.state == JobState.RUNNING and obj.lease_expires_at:
                by = "by a job lease"
            else:
                by = ""
            wait = obj.attempted_at - obj.scheduled_at
            waited = f", {seconds_text(wait)} after its scheduled time" if wait.days >= 0 else ""
            started = f"attempt {obj.attempt} started"
            events.append((obj.attempted_at, 1, started, by + waited))
        finalized = getattr(obj, "finalized_at", None)
        if finalized is not None:
            ran = f"ran {seconds_text(finalized - obj.attempted_at)}" if obj.attempted_at else ""
            events.append((finalized, 3, obj.state, ran))
        # By time; at the same instant, an attempt starts before it ends.
        events.sort(key=lambda ev: (ev[0] is None, ev[0] or obj.created_at, ev[1]))
        rows = [(time_text(at), what, note) for at, _, what, note in events]
        body = format_html_join(
            "", '<tr><td class="nowrap">{}</td><td>{}</td><td>{}</td></tr>', rows
        )
        return format_html('<table class="hopper-timeline"><tbody>{}</tbody></table>', body)

    # -- the job page: a stable URL and its buttons ----------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        name = f"{opts.app_label}_{opts.model_name}"
        return [
            path(
                "<path:object_id>/find/",
                self.admin_site.admin_view(self.find_view),
                name=f"{name}_find",
            ),
            path(
                "<path:object_id>/act/",
                self.admin_site.admin_view(self.act_view),
                name=f"{name}_act",
            ),
            *super().get_urls(),
        ]

    def find_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Redirect to the job's page wherever it is now: live or history.

        A job moves between the two tables (it finishes, it is retried), so a
        link to it goes through here and never breaks.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            job_id = uuid.UUID(unquote(object_id))
        except ValueError:
            raise Http404(f"no job {unquote(object_id)!r}") from None
        found = find_job(job_id)
        if found is None:
            raise Http404(f"job {job_id} does not exist (deleted, or past retention)")
        return HttpResponseRedirect(job_url(job_id, *found))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Show the job, or follow it to the other table if it moved there."""
        try:
            job_id = uuid.UUID(unquote(object_id))
        except ValueError:
            job_id = None
        if job_id is not None and not self.get_queryset(request).filter(id=job_id).exists():
            alias = request_alias(request)
            refs = job_refs([job_id], alias)
            if job_id in refs:
                return HttpResponseRedirect(job_url(job_id, refs[job_id][0], alias))
        context = {
            **(extra_context or {}),
            "hopper_act_url": admin_url(self.opts.model_name, "act", object_id),
            "hopper_can_operate": self.has_operate_permission(request),
        }
        return super().change_view(request, object_id, form_url, context)

    def act_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Retry, cancel or delete the job from its page, through the same bulk api."""
        if request.method != "POST":
            return HttpResponseRedirect(admin_url(self.opts.model_name, "find", object_id))
        if not self.has_operate_permission(request):
            raise PermissionDenied
        verbs: dict[str, tuple[Callable[[list[uuid.UUID]], JobManyResult], bool]] = {
            "retry": (api.retry_jobs, False),
            "cancel": (api.cancel_jobs, False),
            "delete": (api.delete_jobs, True),
        }
        verb = request.POST.get("verb", "")
        if verb not in verbs:
            raise Http404(f"no job action {verb!r}")
        call, deletion = verbs[verb]
        try:
            job_id = uuid.UUID(unquote(object_id))
        except ValueError:
            raise Http404(f"no job {unquote(object_id)!r}") from None
        outcomes = Outcomes(verb, "job", deletion=deletion)
        count_into(outcomes, call([job_id]))  # on whichever alias holds the job
        self.report(request, outcomes, job_id)
        if find_job(job_id) is None:
            return HttpResponseRedirect(admin_url(self.opts.model_name, "changelist"))
        return HttpResponseRedirect(admin_url(self.opts.model_name, "find", job_id))

    # -- actions ------------------------------------------------------------

    def _bulk(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        call: Callable[..., JobManyResult],
        verb: str,
        deletion: bool = False,
    ) -> None:
        """Apply a bulk api function to the selection in chunks; report once, log once."""
        outcomes = Outcomes(verb, "job", deletion=deletion)
        aliases = topology.aliases()
        if len(aliases) > 1 and queryset.db in aliases:
            call = functools.partial(call, using=queryset.db)  # the alias the list reads
        seen = apply_in_chunks(queryset, call, outcomes)
        self.report(request, outcomes, seen[0] if len(seen) == 1 else None)

    @admin.action(description="Retry selected jobs now", permissions=("operate",))
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._bulk(request, queryset, api.retry_jobs, "retry")

    @admin.action(description="Cancel selected jobs", permissions=("operate",))
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._bulk(request, queryset, api.cancel_jobs, "cancel")

    @admin.action(description="Delete selected jobs", permissions=("operate",))
    def delete_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._bulk(request, queryset, api.delete_jobs, "delete", deletion=True)


@admin.register(Job)
class JobAdmin(JobAdminBase):
    """Live jobs: pending, available, scheduled, retryable and running."""


@admin.register(JobHistory)
class JobHistoryAdmin(JobAdminBase):
    """Finished jobs: completed, canceled and discarded."""

    list_display = (
        "job_id",
        "kind_text",
        "queue",
        "state",
        "attempts",
        "scheduled",
        "finalized",
    )
    fieldsets = (
        *JobAdminBase.fieldsets[:1],
        ("Times", {"fields": ("created", "scheduled", "attempted", "finalized", "timeline")}),
        *JobAdminBase.fieldsets[2:],
        ("Result", {"fields": ("output_pretty",)}),
    )

    finalized = time_column("finalized_at", "finalized at")

    @admin.display(description="output")
    def output_pretty(self, obj: JobHistory) -> SafeString:
        return pretty(obj.output)
