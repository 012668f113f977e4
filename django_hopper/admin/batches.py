"""The batch and workflow admin: progress, callbacks and a workflow's steps."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_hopper import api
from django_hopper.admin.bulk import count_into
from django_hopper.admin.common import (
    EMPTY,
    AliasAdminMixin,
    FieldsetsViewAdmin,
    Outcomes,
    UUIDSearchMixin,
    admin_url,
    job_link,
    on_alias,
    pretty,
    request_alias,
    row_alias,
    time_column,
)
from django_hopper.admin.filters import DatabaseFilter
from django_hopper.admin.graph import dag_svg
from django_hopper.batches import get_batch
from django_hopper.exceptions import HopperError
from django_hopper.models import LIVE_STATES, Batch
from django_hopper.workflows import get_workflow


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
class BatchAdmin(AliasAdminMixin, UUIDSearchMixin, FieldsetsViewAdmin):
    """Batches and workflows: progress, callbacks, metadata, and a workflow's graph.

    A batch or workflow lives on the database of its queues: the list shows
    one alias at a time, and its page reads, links and acts on that alias.
    """

    list_display = (
        "id",
        "name",
        "is_workflow",
        "total",
        "pending",
        "failed",
        "completed",
        "created",
    )
    list_filter = (DatabaseFilter, BatchCompletedFilter, "is_workflow")
    search_fields = ("name",)
    search_help_text = "A batch or workflow ID (exact), or part of a workflow's name."
    ordering = ("-id",)  # UUIDv7: newest first
    list_per_page = 50
    sortable_by = ("id",)  # creation order; other sorts read the whole table
    fieldsets: Any = (
        (None, {"fields": ("id", "name", "is_workflow", "created", "completed")}),
        ("Progress", {"fields": ("progress", "jobs_links")}),
        ("Callbacks", {"fields": ("on_success_pretty", "on_failure_pretty", "on_complete_pretty")}),
        ("Metadata", {"fields": ("metadata_pretty",)}),
    )

    created = time_column("created_at", "created at")
    completed = time_column("completed_at", "completed at")

    def get_fieldsets(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """Add the steps and edges of a workflow."""
        if isinstance(obj, Batch) and obj.is_workflow:
            return (*self.fieldsets, ("Steps", {"fields": ("workflow_graph", "workflow_steps")}))
        return self.fieldsets

    @admin.display(description="progress")
    def progress(self, obj: Batch) -> str:
        """Show progress: a workflow's from its steps' states now, a batch's as the api reads it.

        A retried step of a finished workflow is live again, so the stored
        counters (folded once, when the step first finished) no longer say
        what the workflow is doing; the steps do.
        """
        if obj.is_workflow:
            try:
                wf = get_workflow(obj.id, alias=row_alias(obj))
            except HopperError as exc:
                return f"progress unavailable: {exc}"
            states = Counter(j.state for j in wf.jobs)
            live = sum(n for s, n in states.items() if s in LIVE_STATES)
            parts = [f"{n} {s}" for s, n in sorted(states.items())]
            state = "open" if live else "finished"
            return f"{state}: {len(wf.jobs)} steps: {', '.join(parts) or 'none'}"

        try:
            row = get_batch(obj.id, alias=row_alias(obj))
        except HopperError as exc:
            return f"progress unavailable: {exc}"
        done = row.total - row.pending
        state = "completed" if row.completed_at else "open"
        return (
            f"{state}: {done} of {row.total} finished ({row.failed} canceled or discarded), "
            f"{row.pending} pending"
        )

    @admin.display(description="graph")
    def workflow_graph(self, obj: Batch) -> SafeString:
        """Draw the workflow's steps and edges as an SVG, each step linked to its job."""
        try:
            wf = get_workflow(obj.id, alias=row_alias(obj))
        except HopperError as exc:
            return format_html("<em>workflow unavailable: {}</em>", exc)
        return dag_svg(wf)

    # -- the workflow page's buttons ---------------------------------------------------

    change_form_template = "admin/django_hopper/batch/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        act = path(
            "<path:object_id>/act/",
            self.admin_site.admin_view(self.act_view),
            name=f"{opts.app_label}_{opts.model_name}_act",
        )
        return [act, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        can = request.user.has_perm("django_hopper.change_job") and request.user.has_perm(
            "django_hopper.change_jobhistory"
        )
        context = {
            **(extra_context or {}),
            "hopper_act_url": on_alias(
                admin_url("batch", "act", object_id), request_alias(request)
            ),
            "hopper_can_operate": can,
        }
        return super().change_view(request, object_id, form_url, context)

    def act_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Retry a workflow's failed steps, or cancel its steps not yet finished."""
        alias = request_alias(request)  # the page's database: the workflow and its steps
        back = HttpResponseRedirect(on_alias(admin_url("batch", "change", object_id), alias))
        if request.method != "POST":
            return back
        can = request.user.has_perm("django_hopper.change_job") and request.user.has_perm(
            "django_hopper.change_jobhistory"
        )
        if not can:
            raise PermissionDenied
        verb = request.POST.get("verb")
        try:
            wf = get_workflow(uuid.UUID(unquote(object_id)), alias=alias)
        except (ValueError, HopperError) as exc:
            raise Http404(str(exc)) from None
        if verb == "retry_failed":
            ids = [j.id for j in wf.jobs if j.state in ("discarded", "canceled")]
            outcomes = Outcomes("retry failed steps of", "job")
            count_into(outcomes, api.retry_jobs(ids, using=alias))
        elif verb == "cancel_rest":
            ids = [j.id for j in wf.jobs if j.state in LIVE_STATES]
            outcomes = Outcomes("cancel the rest of", "job")
            count_into(outcomes, api.cancel_jobs(ids, using=alias))
        else:
            raise Http404(f"no workflow action {verb!r}")
        if outcomes.total:
            self.report(request, outcomes, object_id)
        else:
            self.message_user(request, "No step to act on.", messages.WARNING)
        return back

    @admin.display(description="jobs")
    def jobs_links(self, obj: Batch) -> SafeString:
        """Link the batch's jobs in the live and the history lists."""
        alias = row_alias(obj)
        live = on_alias(admin_url("job", "changelist") + f"?batch_id={obj.id}", alias)
        done = on_alias(admin_url("jobhistory", "changelist") + f"?batch_id={obj.id}", alias)
        return format_html(
            '<a href="{}">live jobs</a> &middot; <a href="{}">finished</a>', live, done
        )

    @staticmethod
    def _callback(params: Any) -> SafeString:
        """Show a callback's kind and queue, then its stored insert params."""
        if not isinstance(params, dict):
            return mark_safe(EMPTY)
        return format_html(
            "{} on queue {}{}", params.get("kind", "?"), params.get("queue", "?"), pretty(params)
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
        return pretty(obj.metadata)

    @admin.display(description="steps")
    def workflow_steps(self, obj: Batch) -> SafeString:
        """Show each job of the workflow (step, state, link) and the jobs it runs after."""
        alias = row_alias(obj)
        try:
            wf = get_workflow(obj.id, alias=alias)
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
                        job_link(
                            e.depends_on, states.get(e.depends_on), label(e.depends_on), alias
                        ),
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
                    job_link(j.id, j.state, alias=alias),
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
