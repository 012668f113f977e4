"""The resumable run admins: live and finished runs of ``@resumable`` kinds.

A run is a job, so these pages are the job admins narrowed to the resumable
kinds registered in this process, with the columns an operator reads a run
by: what it walks (its instance), where the walk stands (step, cursor,
passes), and, while it is live, its pass lease and admission misses. The rows
come from the engine's tolerant read (``DecodedChangeList``) turned into
``RunRow``s by the function ``list_runs`` uses (``runs.run_row``,
``runs.with_pass_state``): a run whose stored values or progress do not
decode is listed with its error, never a failed page. The actions are the
job actions (retry, cancel), through the same bulk api.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import is_aware, localtime

from django_hopper import registry, runs
from django_hopper.admin.common import (
    EMPTY,
    ROW_EXTRA,
    admin_url,
    job_url,
    request_alias,
    time_text,
)
from django_hopper.admin.decoded import decoded_row
from django_hopper.admin.filters import EqualsFilter
from django_hopper.admin.jobs import JobAdminBase, _other_alias
from django_hopper.engine import get_engine
from django_hopper.models import FinishedRun, ResumableRun

#: The attribute of a listed row holding its ``RunRow``.
RUN = "_hopper_run"
#: How much of a cursor a list cell shows (the whole is on hover).
CURSOR_SHOWN = 30


def clock_text(value: dt.datetime) -> str:
    """Render a time of day to the second in the current time zone (a list cell)."""
    return localtime(value).strftime("%H:%M:%S") if is_aware(value) else str(value)


def run_of(obj: Model) -> runs.RunRow | None:
    """Return the run the list read for a row (None outside the list)."""
    return getattr(obj, RUN, None)


class RunKindFilter(EqualsFilter):
    """The ``@resumable`` kinds registered in this process."""

    title = "kind"
    parameter_name = "kind"
    field = "kind"

    def choices_for(self, request: HttpRequest, model_admin: Any) -> list[str]:
        return list(registry.resumable())


class RunAdminBase(JobAdminBase):
    """What the live and the finished run admins share."""

    list_display: tuple[str, ...] = (
        "run_id",
        "kind_text",
        "state",
        "cursor_text",
        "passes_text",
        "pass_lease",
        "erased_text",
    )
    list_display_links = None  # the ID links the job's own page
    list_filter = (*JobAdminBase.list_filter[:-1], RunKindFilter)
    search_help_text = "A run's job ID (exact), or a resumable kind (exact, or part of one)."
    actions = ("retry_jobs", "cancel_jobs")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """List only the jobs of the resumable kinds (the ``(kind, id)`` index)."""
        kinds = registry.resumable()
        queryset = super().get_queryset(request)
        return queryset.filter(kind__in=kinds) if kinds else queryset.none()

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Read each row's run from its decoded job, and the live runs' pass state in
        one more engine read for the page; the run's decode error is the row's."""
        decoded = [(obj, decoded_row(obj)) for obj in rows]
        read = [runs.run_row(job) for _, job in decoded if job is not None]
        found = {r.id: r for r in runs.with_pass_state(read, get_engine(request_alias(request)))}
        for obj, _ in decoded:
            run = found.get(obj.pk)
            setattr(obj, RUN, run)
            setattr(obj, ROW_EXTRA, (run.decode_error or "") if run else "")

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Show a run on its job's page (it moves to history when it finishes)."""
        return HttpResponseRedirect(admin_url("job", "find", object_id))

    # -- columns -----------------------------------------------------------

    @admin.display(description="ID", ordering="id")
    def run_id(self, obj: Model) -> SafeString:
        """Link the run's job page, showing the short ID (the whole on hover)."""
        text = str(obj.pk)
        url = job_url(obj.pk, obj.state, _other_alias(obj))  # type: ignore[attr-defined]
        return format_html(
            '<a href="{}" title="{}">{}&hellip;{}</a>', url, text, text[:8], text[-4:]
        )

    @admin.display(description="instance / kind")
    def kind_text(self, obj: Model) -> SafeString:
        """Show what the run walks (its unique key without the kind, or its whole key)
        over its kind, and under them why the run does not decode, if it does not."""
        run = run_of(obj)
        instance = (run.instance or run.job.unique_key) if run else None
        kind = super().kind_text(obj)  # type: ignore[arg-type]
        return format_html("<strong>{}</strong><br>{}", instance or EMPTY, kind)

    @admin.display(description="step / cursor")
    def cursor_text(self, obj: Model) -> SafeString | str:
        """Show the last step the run recorded (when, on hover) over its committed cursor,
        cut short (the whole on hover); "done" once the finishing pass committed."""
        run = run_of(obj)
        if run is None:
            return EMPTY
        progress = run.job.progress
        step = mark_safe(EMPTY)
        if progress is not None:
            at = time_text(progress.recorded_at)
            step = format_html('<span title="{}">{}</span>', at, progress.step or EMPTY)
        if run.cursor is None and not run.done:
            return format_html("{}<br>{}", step, EMPTY)
        text = json.dumps(run.cursor, sort_keys=True, ensure_ascii=False, default=str)
        short = text if len(text) <= CURSOR_SHOWN else text[: CURSOR_SHOWN - 3] + "..."
        done = " (done)" if run.done else ""
        return format_html('{}<br><code title="{}">{}</code>{}', step, text, short, done)

    @admin.display(description="passes / tries")
    def passes_text(self, obj: Model) -> str:
        """Show the committed passes, and the failed passes since the last commit."""
        run = run_of(obj)
        if run is None:
            return EMPTY
        return f"{run.passes} / {run.attempt} of {run.job.max_attempts}"

    @admin.display(description="pass lease / misses")
    def pass_lease(self, obj: Model) -> SafeString | str:
        """Say when the current pass began and when its lease expires (database times,
        the date on hover), and the run's admission misses: consecutive claims that
        did not begin their pass."""
        run = run_of(obj)
        if run is None:
            return EMPTY
        misses = format_html(
            '<span class="hopper-run-misses">{} {}</span>',
            run.admission_misses,
            "miss" if run.admission_misses == 1 else "misses",
        )
        if run.lease_expires_at is None:
            return misses if run.admission_misses else EMPTY
        began = run.pass_began_at
        return format_html(
            '<span title="{} / {}">{}<br>expires {}</span><br>{}',
            time_text(began),
            time_text(run.lease_expires_at),
            f"began {clock_text(began)}" if began else "not begun",
            clock_text(run.lease_expires_at),
            misses,
        )

    @admin.display(description="erased")
    def erased_text(self, obj: Model) -> SafeString | str:
        """Say when the run's data was erased (erase_subject), if it was."""
        run = run_of(obj)
        if run is None or run.erased_at is None:
            return "no"
        return format_html('<span title="{}">yes</span>', time_text(run.erased_at))


@admin.register(ResumableRun)
class ResumableRunAdmin(RunAdminBase):
    """Live runs: waiting for their next pass, or running one."""


@admin.register(FinishedRun)
class FinishedRunAdmin(RunAdminBase):
    """Finished runs: completed, canceled or discarded."""

    list_display = (
        *RunAdminBase.list_display[:5],
        "finalized",
        "erased_text",
    )

    @admin.display(description="finalized at")
    def finalized(self, obj: Model) -> str:
        run = run_of(obj)
        return time_text(run.finalized_at) if run else EMPTY
