"""Changelist filters whose choices come from small tables, never from the jobs.

Django's default filter on a column lists its values with ``SELECT
DISTINCT`` over the whole table, a full scan of a million history rows per
page load. The choices here come from what is small and known: the states a
table can hold, the queues table, the kinds this process has registered.
Each filter also accepts a value it does not list (a link may name an old
queue or an unregistered kind), and filters by equality, which the
``(state, queue, id)`` and ``(kind, id)`` indexes serve.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from django_hopper import topology
from django_hopper.admin.common import DATABASE_VAR, request_alias
from django_hopper.jobs import registry
from django_hopper.models import Job, Queue
from django_hopper.types import FINAL_STATES, LIVE_STATES


class EqualsFilter(admin.SimpleListFilter):
    """A filter on one column by equality, listing choices from somewhere cheap."""

    #: The model field this filter compares.
    field: str = ""

    def choices_for(self, request: HttpRequest, model_admin: Any) -> list[str]:
        """Return the values to list (a small, bounded set)."""
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = list(self.choices_for(request, model_admin))
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(v, v) for v in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value:
            return queryset.filter(**{self.field: value})
        return queryset


class DatabaseFilter(admin.SimpleListFilter):
    """The database alias the list reads, with queues on several aliases.

    One alias at a time: a page stays one indexed query on one database
    (merging pages across databases would cost a query per alias and break
    the paginator's count). The admin's ``get_queryset`` applies the choice
    (``AliasAdminMixin``), so that the detail page, its actions and the bulk
    actions read and act on the same alias. Hidden with one alias.
    """

    title = "database"
    parameter_name = DATABASE_VAR

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        aliases = topology.aliases()
        return [(a, a) for a in aliases] if len(aliases) > 1 else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset  # the admin's get_queryset reads the alias (request_alias)

    def choices(self, changelist: Any) -> Any:
        current = self.value() or topology.aliases()[0]
        for alias, label in self.lookup_choices:
            yield {
                "selected": alias == current,
                "query_string": changelist.get_query_string({self.parameter_name: alias}),
                "display": label,
            }


class StateFilter(EqualsFilter):
    """The states the listed table can hold: live states for jobs, final ones for history."""

    title = "state"
    parameter_name = "state"
    field = "state"

    def choices_for(self, request: HttpRequest, model_admin: Any) -> list[str]:
        return list(LIVE_STATES if issubclass(model_admin.model, Job) else FINAL_STATES)


class QueueFilter(EqualsFilter):
    """The queues the cluster knows (the queues table), by name."""

    title = "queue"
    parameter_name = "queue"
    field = "queue"

    def choices_for(self, request: HttpRequest, model_admin: Any) -> list[str]:
        queues = Queue.objects.order_by("name")
        alias = request_alias(request)
        if alias is not None:
            queues = queues.using(alias)
        return list(queues.values_list("name", flat=True)[:200])


class KindFilter(EqualsFilter):
    """The job kinds registered in this process (``@job`` functions)."""

    title = "kind"
    parameter_name = "kind"
    field = "kind"

    def choices_for(self, request: HttpRequest, model_admin: Any) -> list[str]:

        return sorted(registry)


class PausedFilter(admin.SimpleListFilter):
    """Queues paused or running, in words."""

    title = "paused"
    parameter_name = "paused"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "paused"), ("no", "running")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(paused_at__isnull=self.value() == "no")
        return queryset
