"""The batch and workflow admin: progress, callbacks and a workflow's steps."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_hopper.admin.common import (
    EMPTY,
    FieldsetsViewAdmin,
    UUIDSearchMixin,
    admin_url,
    job_link,
    pretty,
    time_column,
)
from django_hopper.exceptions import HopperError
from django_hopper.models import (
    Batch,
)


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
        "completed",
        "created",
    )
    list_filter = (BatchCompletedFilter, "is_workflow")
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
        live = admin_url("job", "changelist") + f"?batch_id={obj.id}"
        done = admin_url("jobhistory", "changelist") + f"?batch_id={obj.id}"
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
                        job_link(e.depends_on, states.get(e.depends_on), label(e.depends_on)),
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
                    job_link(j.id, j.state),
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
