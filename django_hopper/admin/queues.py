"""The queue admin: depths, pause and resume, and the limits form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_hopper import queues
from django_hopper.admin.common import (
    EMPTY,
    ROW_EXTRA,
    FieldsetsViewAdmin,
    Outcomes,
    admin_url,
    audit,
    bounded_stats,
    depth_texts,
    read_stats,
    request_alias,
    row_extra_or_read,
    seconds_text,
    time_column,
)
from django_hopper.admin.filters import DatabaseFilter, PausedFilter
from django_hopper.admin.overview import overview_view
from django_hopper.exceptions import HopperError, InvalidJob
from django_hopper.models import (
    Queue,
)
from django_hopper.types import QueueStats, Stats


class QueueLimitsForm(forms.Form):
    """The five limits of a queue. Blank or zero removes one.

    The form checks types only: what a valid limit is (non-negative, a burst
    with a rate ...) is decided by ``queues.check_queue_limits``, the check
    ``set_queue_limits`` runs, whose InvalidJob becomes the error of the field
    it names; every field is checked, so every error shows at once.
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

    def _api_values(self) -> dict[str, Any]:
        """Return the cleaned values as ``set_queue_limits`` takes them (blank: unset)."""
        data = self.cleaned_data
        return {
            "rate_per_sec": data["rate_per_sec"] or 0,
            "burst": data["burst"],
            "global_limit": data["global_limit"] or 0,
            "partition_limit": data["partition_limit"] or 0,
            "aging": data["aging"] or 0,
        }

    def _refused(self, exc: InvalidJob) -> str | None:
        """Show the api's refusal on the field it names (once per field); return that field."""
        field = self.API_FIELDS.get(exc.field or "", exc.field)
        target = field if field in self.fields else None
        if target is None or target not in self.errors:
            self.add_error(target, str(exc))
        return target

    def check_all(self, name: str) -> bool:
        """Check every value with the api's own rules and keep every refusal, not just the first.

        Each value is checked on its own (``check_queue_limits`` writes
        nothing), then the values that passed together, for the rules that
        tie two fields (a burst needs a rate).
        """
        values = self._api_values()
        failed: set[str] = set()
        for key in ("rate_per_sec", "global_limit", "partition_limit", "aging"):
            try:
                queues.check_queue_limits(name, **{key: values[key]})
            except InvalidJob as exc:
                failed.add(self._refused(exc) or key)
        if "rate_per_sec" not in failed:
            try:
                queues.check_queue_limits(
                    name, **{k: v for k, v in values.items() if k not in failed}
                )
            except InvalidJob as exc:
                self._refused(exc)
        return not self.errors

    def describe(self) -> str:
        """Say the limits saved, for the message and the admin log."""
        values = self._api_values()
        shown = [f"{k} {v}" for k, v in values.items() if v]
        return ", ".join(shown) or "none"

    def apply(self, name: str) -> bool:
        """Check every value, then set the limits through the api; return success."""
        if not self.check_all(name):
            return False
        try:
            queues.set_queue_limits(name, **self._api_values())
        except InvalidJob as exc:
            self._refused(exc)
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
        "updated",
    )
    list_filter = (DatabaseFilter, PausedFilter)
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("pause_queues", "resume_queues", "set_limits")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Read the queues of the alias the request names (``?database=``), else DATABASE's.

        The actions and the limits form act on each queue's own alias
        (:mod:`django_hopper.queues`), whichever list they come from.
        """
        queryset = super().get_queryset(request)
        alias = request_alias(request)
        return queryset if alias is None else queryset.using(alias)

    fieldsets = (
        (None, {"fields": ("name", "paused", "paused_since", "created", "updated")}),
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

    def get_list_display(self, request: HttpRequest) -> Any:
        """Offer "set limits" only to users who may set them (the form answers 403 otherwise)."""
        shown = super().get_list_display(request)
        if self.has_operate_permission(request):
            return shown
        return [name for name in shown if name != "limits_link"]

    def get_fieldsets(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """Drop the "set limits" link for users who may not set them."""
        fieldsets = super().get_fieldsets(request, obj)
        if self.has_operate_permission(request):
            return fieldsets
        return [
            (title, {**opts, "fields": [f for f in opts["fields"] if f != "limits_link"]})
            for title, opts in fieldsets
        ]

    def annotate_rows(self, request: HttpRequest, rows: list[Any]) -> None:
        """Attach each queue's depths from one stats read for the whole page."""
        stats = read_stats(self, request)
        texts = depth_texts(stats)
        for queue in rows:
            depths = stats.queues.get(queue.name, QueueStats())
            shown = (
                texts.get(queue.name) or depth_texts(Stats(queues={queue.name: depths}))[queue.name]
            )
            setattr(queue, ROW_EXTRA, (depths, shown))

    def _read(self, obj: Queue) -> tuple[QueueStats, dict[str, str]]:
        """Return the depths attached by the changelist, or read them (the detail page)."""

        def read() -> tuple[QueueStats, dict[str, str]]:
            depths = bounded_stats().queues.get(obj.name, QueueStats())
            return depths, depth_texts(Stats(queues={obj.name: depths}))[obj.name]

        extra: tuple[QueueStats, dict[str, str]] = row_extra_or_read(obj, read)
        return extra

    def _depths(self, obj: Queue) -> QueueStats:
        return self._read(obj)[0]

    def _count(self, obj: Queue, state: str) -> str:
        """Return a state's count as shown: exact, ``about N`` or ``N+``."""
        return self._read(obj)[1][state]

    paused_since = time_column("paused_at", "paused at")
    created = time_column("created_at", "created at")
    updated = time_column("updated_at", "updated at")

    @admin.display(boolean=True, description="paused")
    def paused(self, obj: Queue) -> bool:
        return obj.paused_at is not None

    @admin.display(description="available")
    def available(self, obj: Queue) -> str:
        return self._count(obj, "available")

    @admin.display(description="scheduled")
    def scheduled(self, obj: Queue) -> str:
        return self._count(obj, "scheduled")

    @admin.display(description="retryable")
    def retryable(self, obj: Queue) -> str:
        return self._count(obj, "retryable")

    @admin.display(description="running")
    def running(self, obj: Queue) -> str:
        return self._count(obj, "running")

    @admin.display(description="depths")
    def depths(self, obj: Queue) -> str:
        d = self._depths(obj)
        count = self._read(obj)[1]
        return (
            f"available {count['available']}, scheduled {count['scheduled']}, "
            f"retryable {count['retryable']}, running {count['running']}; "
            "oldest available waited "
            f"{seconds_text(d.oldest_available)}; completed in the last minute "
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
        return seconds_text(obj.aging) if obj.aging else EMPTY

    @admin.display(description="limits")
    def limits_link(self, obj: Queue) -> SafeString:
        return format_html('<a href="{}">set limits</a>', admin_url("queue", "limits", obj.pk))

    # -- actions ------------------------------------------------------------

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        action: Callable[[str], Any],
        verb: str,
        done: str,
    ) -> None:
        """Call a queues function per selected queue (a handful); report once."""
        self._apply_each(
            request, queryset.values_list("name", flat=True), action, Outcomes(verb, "queue"), done
        )

    @admin.action(description="Pause selected queues", permissions=("operate",))
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._apply(request, queryset, queues.pause_queue, "pause", "paused")

    @admin.action(description="Resume selected queues", permissions=("operate",))
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._apply(request, queryset, queues.resume_queue, "resume", "resumed")

    @admin.action(description="Set limits of the selected queue", permissions=("operate",))
    def set_limits(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> HttpResponseRedirect | None:
        """Open the limits form of the one selected queue (limits differ per queue)."""
        names = list(queryset.values_list("name", flat=True)[:2])
        if len(names) != 1:
            self.message_user(request, "Select exactly one queue to set limits.", messages.WARNING)
            return None
        return HttpResponseRedirect(admin_url("queue", "limits", names[0]))

    # -- the limits form ------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        limits = path(
            "<path:object_id>/limits/",
            self.admin_site.admin_view(self.limits_view),
            name=f"{opts.app_label}_{opts.model_name}_limits",
        )
        overview = path(
            "overview/",
            self.admin_site.admin_view(self.overview_view),
            name=f"{opts.app_label}_{opts.model_name}_overview",
        )
        return [overview, limits, *super().get_urls()]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        """Show every queue, the last hour and the clients on one page (view permission)."""
        if not self.has_view_permission(request):
            raise PermissionDenied

        return overview_view(self, request)

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
                text = f"Limits of queue {queue.name} set: {form.describe()}."
                self.message_user(request, text, messages.SUCCESS)
                audit(request, Queue, f"set limits of queue {queue.name}", text, queue.name)
                return HttpResponseRedirect(admin_url("queue", "changelist"))
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
