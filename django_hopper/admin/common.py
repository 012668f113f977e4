"""What every hopper admin shares: read-only admins, row annotation, links and renderers."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model, QuerySet
from django.http import HttpRequest, QueryDict
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import is_aware, localtime

from django_hopper import queues, topology
from django_hopper.admin.pagination import (
    COUNT_VAR,
    EstimatedCountPaginator,
    HopperChangeList,
    planner_estimates,
)
from django_hopper.engine import get_engine
from django_hopper.engine.params import StatsBoundedParams
from django_hopper.exceptions import HopperError
from django_hopper.models import Job, JobHistory
from django_hopper.types import FINAL_STATES, Stats

EMPTY = "-"


def pretty(value: Any) -> SafeString:
    """Render a JSON value indented in a <pre>, escaped."""
    if value is None or value == {} or value == []:
        return mark_safe(EMPTY)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="hopper-json">{}</pre>', text)


#: Where a changelist keeps what it read once for all its rows (stats, job states).
ROW_EXTRA = "_hopper_admin_extra"


def row_extra(obj: Model) -> Any:
    """Return what the changelist attached to a row (see ``annotate_rows``), or None."""
    return getattr(obj, ROW_EXTRA, None)


def row_extra_or_read(obj: Model, read: Callable[[], Any]) -> Any:
    """Return what the changelist attached to a row, or read it (the detail page) and attach it."""
    extra = row_extra(obj)
    if extra is None:
        extra = read()
        setattr(obj, ROW_EXTRA, extra)
    return extra


def time_text(value: dt.datetime | None) -> str:
    """Render a time to the second in the current time zone (leases and waits are seconds)."""
    if value is None:
        return EMPTY
    return localtime(value).strftime("%Y-%m-%d %H:%M:%S") if is_aware(value) else str(value)


def time_column(field: str, description: str) -> Any:
    """Return an admin column showing a model's time field to the second."""

    @admin.display(description=description)
    def column(model_admin: admin.ModelAdmin, obj: Model) -> str:
        return time_text(getattr(obj, field))

    return column


def admin_url(model: str, view: str, *args: Any) -> str:
    """Return the URL of one of this app's admin views, quoting primary keys as Django does."""
    return reverse(f"admin:django_hopper_{model}_{view}", args=[quote(a) for a in args])


#: The query parameter naming the database alias a job page or list reads.
DATABASE_VAR = "database"


def request_alias(request: HttpRequest) -> str | None:
    """Return the alias a job page or list reads (``?database=``), or None for ``DATABASE``.

    Only with queues on several aliases (``HOPPER["QUEUE_DATABASES"]``), and
    only an alias hopper's jobs live on. A job page opened from a filtered
    list finds it in the list's preserved filters.
    """
    aliases = topology.aliases()
    if len(aliases) < 2:
        return None
    alias = request.GET.get(DATABASE_VAR)
    if alias is None:
        alias = QueryDict(request.GET.get("_changelist_filters", "")).get(DATABASE_VAR)
    return alias if alias in aliases and alias != aliases[0] else None


def on_alias(url: str, alias: str | None) -> str:
    """Name ``alias`` in an admin URL (``?database=``) when it is not ``DATABASE``.

    A page on another alias links its rows' pages, lists and actions on that
    alias; without it they would read ``DATABASE``, where the row is not.
    """
    if alias is None or alias == topology.aliases()[0]:
        return url
    return url + ("&" if "?" in url else "?") + urlencode({DATABASE_VAR: alias})


def row_alias(obj: Model) -> str | None:
    """Return the alias a row was read from when it is hopper's and not ``DATABASE``, else None."""
    alias = obj._state.db
    aliases = topology.aliases()
    return alias if alias in aliases[1:] else None


class AliasAdminMixin:
    """Read the rows of the alias the request names (``?database=``), else ``DATABASE``'s.

    With queues on several aliases each database has its own clients, leader,
    batches and workflows; the admin shows one alias at a time (its
    ``DatabaseFilter``), and the detail page and its buttons read and act on
    the alias the page was opened on.
    """

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        alias = request_alias(request)
        return queryset if alias is None else queryset.using(alias)


def job_url(job_id: uuid.UUID, state: str, alias: str | None = None) -> str:
    """Return the admin page of a job: history for finished states, live otherwise.

    ``alias`` (a job on another alias than ``DATABASE``) is named in the URL.
    """
    return on_alias(
        admin_url("jobhistory" if state in FINAL_STATES else "job", "change", job_id), alias
    )


def job_refs(
    ids: Iterable[uuid.UUID], alias: str | None = None
) -> dict[uuid.UUID, tuple[str, str | None]]:
    """Return (state, step) of each job found, live first, then history: two queries at most.

    A job moves from live to history when it finishes, so the page it lives
    on is only known by looking; jobs in neither (deleted, or past retention)
    are left out. ``alias`` reads another alias than the router's.
    """
    wanted = set(ids)
    if not wanted:
        return {}
    live, history = Job.objects.all(), JobHistory.objects.all()
    if alias is not None:
        live, history = live.using(alias), history.using(alias)
    refs: dict[uuid.UUID, tuple[str, str | None]] = {
        i: (state, step)
        for i, state, step in live.filter(id__in=wanted).values_list("id", "state", "step")
    }
    rest = wanted - refs.keys()
    if rest:
        rows = history.filter(id__in=rest).values_list("id", "state", "step")
        refs.update({i: (state, step) for i, state, step in rows})
    return refs


def find_job(job_id: uuid.UUID) -> tuple[str, str | None] | None:
    """Return (state, alias) of a job on whichever alias holds it, or None.

    ``DATABASE`` first (read as the router says), then each alias of
    ``HOPPER["QUEUE_DATABASES"]``: two queries per alias tried at most.
    """
    aliases = topology.aliases()
    for i, alias in enumerate(aliases):
        refs = job_refs([job_id], None if i == 0 else alias)
        if job_id in refs:
            return refs[job_id][0], None if i == 0 else alias
    return None


def job_link(
    job_id: uuid.UUID | None, state: str | None, label: str | None = None, alias: str | None = None
) -> SafeString:
    """Link a job to its admin page (on ``alias``) with its state, or say it is gone."""
    if job_id is None:
        return mark_safe(EMPTY)
    if state is None:
        return format_html("{} <em>(gone)</em>", label or job_id)
    url = job_url(job_id, state, alias)
    return format_html('<a href="{}">{}</a> ({})', url, label or job_id, state)


def client_link(client_id: Any, alias: str | None = None) -> SafeString:
    """Link a client's admin page (on ``alias``: client IDs are numbered per database)."""
    url = on_alias(admin_url("client", "change", client_id), alias)
    return format_html('<a href="{}">{}</a>', url, client_id)


def seconds_text(value: dt.timedelta | float | None) -> str:
    """Render a duration in seconds, or the empty marker."""
    if value is None:
        return EMPTY
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    return f"{seconds:g}s"


#: On the overview, queues and clients pages, each queue's count of jobs in a
#: state is exact up to this many; above, an estimate (see ``depth_texts``).
DEPTH_LIMIT = 1_000


def bounded_stats(alias: str | None = None) -> Stats:
    """Read the cluster's stats with each depth counted up to ``DEPTH_LIMIT``: a page
    reloaded every few seconds costs the same whatever the number of live jobs.

    With ``alias``, that database's alone: its own leader and running jobs by
    client (client IDs are numbered per database), one query.
    """
    if alias is None:
        return queues.stats(limit=DEPTH_LIMIT)
    return get_engine(alias).stats_bounded(StatsBoundedParams(limit=DEPTH_LIMIT))


def read_stats(
    model_admin: admin.ModelAdmin, request: HttpRequest, alias: str | None = None
) -> Stats:
    """Read the cluster's stats once for a page; on failure say so and show no depths."""
    try:
        return bounded_stats(alias)
    except (HopperError, NotImplementedError) as exc:
        model_admin.message_user(request, f"Stats unavailable: {exc}", messages.WARNING)
        return Stats()


DEPTH_STATES = ("available", "scheduled", "retryable", "running")


def depth_texts(stats: Stats) -> dict[str, dict[str, str]]:
    """Show each queue's count of jobs in each state: exact, or marked as not.

    A count that stopped at the limit shows PostgreSQL's planner estimate
    (``about 20,000``, from the table statistics) when that is above the
    limit, else the floor (``1,000+``). The estimates of a page come from
    one ``EXPLAIN`` per database, however many counts stopped.
    """
    capped: dict[str, list[tuple[str, str]]] = {}
    for name, depths in stats.queues.items():
        for state in depths.capped:
            capped.setdefault(topology.queue_alias(name), []).append((name, state))
    estimates: dict[tuple[str, str], int] = {}
    for alias, pairs in capped.items():
        sets = [Job.objects.using(alias).filter(queue=q, state=s) for q, s in pairs]
        estimates.update(zip(pairs, planner_estimates(sets) or [], strict=False))
    out: dict[str, dict[str, str]] = {}
    for name, depths in stats.queues.items():
        texts = out[name] = {}
        for state in DEPTH_STATES:
            count: int = getattr(depths, state)
            estimate = estimates.get((name, state), 0)
            if state not in depths.capped:
                texts[state] = str(count)
            elif estimate > count:
                texts[state] = f"about {estimate:,}"
            else:
                texts[state] = f"{count:,}+"
    return out


#: How many refusals an action's message spells out (the rest are counted).
REFUSALS_SHOWN = 5


@dataclass
class Outcomes:
    """What an operator action did: counts per outcome, refusals by reason, a few examples."""

    action: str
    noun: str
    deletion: bool = False
    done: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def add(self, outcome: str, count: int = 1) -> None:
        if count:
            self.done[outcome] += count

    def refuse(self, reason: str, example: str, count: int = 1) -> None:
        """Count refusals for one reason; keep the first few examples to show."""
        self.refused[reason] += count
        if len(self.examples) < REFUSALS_SHOWN:
            self.examples.append(example)

    @property
    def done_total(self) -> int:
        return sum(self.done.values())

    @property
    def total(self) -> int:
        return self.done_total + sum(self.refused.values())

    def summary(self) -> str:
        """Say what was asked of how many, e.g. "cancel 20000 jobs"."""
        plural = "" if self.total == 1 else "s"
        return f"{self.action} {self.total} {self.noun}{plural}"

    def message(self) -> str:
        """Say the counts per outcome, then the first refusals."""
        parts = [f"{n} {outcome}" for outcome, n in self.done.most_common()]
        parts += [f"{n} refused ({reason})" for reason, n in self.refused.most_common()]
        text = f"{self.summary().capitalize()}: {', '.join(parts)}."
        if self.examples:
            more = sum(self.refused.values()) - len(self.examples)
            tail = f" (and {more} more)" if more > 0 else ""
            text += f" Refused: {'; '.join(self.examples)}{tail}."
        return text


def audit(
    request: HttpRequest,
    model: type[Model],
    what: str,
    message: str,
    object_id: Any = None,
    deletion: bool = False,
) -> None:
    """Record an operator action in Django's admin log: who, what, how many, the outcome."""

    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type_id=ContentType.objects.get_for_model(model, for_concrete_model=False).pk,
        object_id=None if object_id is None else str(object_id),
        object_repr=what[:200],
        action_flag=DELETION if deletion else CHANGE,
        change_message=message,
    )


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that shows rows and never writes them through the ORM.

    Hopper's tables are written by the engine (with fences and notifications
    the ORM knows nothing of); a form save or a bulk delete would bypass them.
    Its pages count rows up to a bound (see ``EstimatedCountPaginator``).
    """

    show_full_result_count = False  # no second COUNT(*) of the unfiltered table

    class Media:
        css = {"all": ("django_hopper/admin.css",)}
        js = ("django_hopper/admin.js",)

    show_facets = admin.ShowFacets.NEVER  # a count per filter choice, over the whole table

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    # -- a page costs the same whatever the table's size -------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return HopperChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> EstimatedCountPaginator:
        """Count exactly when the operator asks (``?_count=exact``), else bound the count."""
        paginator = EstimatedCountPaginator(queryset, per_page, orphans, allow_empty_first_page)
        paginator.exact = request.GET.get(COUNT_VAR) == "exact"
        return paginator

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Allow the actions to users who may change the model (the admin itself never does)."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def report(self, request: HttpRequest, outcomes: Outcomes, object_id: Any = None) -> None:
        """Show an action's outcome in one message and record it in the admin's log.

        One message whatever the selection's size (counts per outcome and the
        first few refusals); one ``LogEntry`` (who, what, how many), naming
        the object when the action was on one.
        """
        if not outcomes.total:
            return
        if not outcomes.refused:
            level = messages.SUCCESS
        elif outcomes.done_total:
            level = messages.WARNING
        else:
            level = messages.ERROR
        text = outcomes.message()
        self.message_user(request, text, level)
        audit(request, self.model, outcomes.summary(), text, object_id, outcomes.deletion)

    def _apply_each(
        self,
        request: HttpRequest,
        keys: Iterable[Any],
        action: Callable[[Any], Any],
        outcomes: Outcomes,
        done: str,
    ) -> None:
        """Call an api function per selected key (a handful: queues); report once."""
        keys = list(keys)
        for key in keys:
            try:
                action(key)
            except HopperError as exc:
                outcomes.refuse(type(exc).__name__, f"{key}: {exc}")
            else:
                outcomes.add(done)
        self.report(request, outcomes, keys[0] if len(keys) == 1 else None)

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
