"""Counting a changelist without reading the whole table.

A ``COUNT(*)`` over a million history rows costs a second on every page
load. The paginator here counts exactly only up to a threshold (a bounded
count reads at most that many index entries); above it, the page shows the
planner's estimate on PostgreSQL (``EXPLAIN``, from the table statistics) or
"more than the threshold" elsewhere, with a link that counts exactly on
request. Either way a page costs the same few queries whatever the table's
size.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

#: The query parameter that asks for an exact count (``?_count=exact``).
COUNT_VAR = "_count"

#: Up to this many rows a changelist is counted exactly.
EXACT_COUNT_LIMIT = 10_000


def planner_estimate(queryset: QuerySet[Any]) -> int | None:
    """Return PostgreSQL's estimate of the rows the queryset matches, or None elsewhere.

    ``EXPLAIN`` plans the query without running it, so the estimate costs
    the same for a thousand rows as for a billion.
    """
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().query.get_compiler(using=queryset.db).as_sql()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def planner_estimates(querysets: list[QuerySet[Any]]) -> list[int] | None:
    """Return PostgreSQL's estimate for each queryset from one ``EXPLAIN``, or None.

    The querysets (of one database) are planned as the arms of one ``UNION
    ALL``, whose plan keeps an estimate per arm: a page with many estimated
    numbers still costs one query. None on other databases, or when the
    plan does not have one arm per queryset.
    """
    if not querysets:
        return []
    db = querysets[0].db
    connection = connections[db]
    if connection.vendor != "postgresql":
        return None
    if len(querysets) == 1:
        return [planner_estimate(querysets[0]) or 0]
    parts, params = [], []
    for queryset in querysets:
        sql, args = queryset.order_by().query.get_compiler(using=db).as_sql()
        parts.append(f"({sql})")
        params.extend(args)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {' UNION ALL '.join(parts)}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    arms = plan[0]["Plan"].get("Plans", [])
    if len(arms) != len(querysets):
        return None
    return [int(arm["Plan Rows"]) for arm in arms]


class EstimatedCountPaginator(Paginator):
    """A paginator that counts exactly up to a limit and estimates above it.

    ``count_is_estimate`` tells the template to say "about" (or "more
    than") and to offer the exact count.
    """

    #: Count exactly however many rows match (the operator asked for it).
    exact: bool = False
    limit: int = EXACT_COUNT_LIMIT
    count_is_estimate: bool = False

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        """Count exactly up to the limit, else estimate: a bounded cost per page.

        The bounded count comes first: a filter's estimate can be far off
        (thousands estimated, thirty there), and a page must never offer
        pages that do not exist.
        """
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        if self.exact:
            return queryset.count()
        bounded = queryset.order_by()[: self.limit + 1].count()
        if bounded <= self.limit:
            return bounded
        # More than the limit: the planner's estimate (never below what was counted).
        self.count_is_estimate = True
        return max(planner_estimate(queryset) or 0, bounded)


class HopperChangeList(ChangeList):
    """A changelist that treats ``?_count=exact`` as a request, not as a filter."""

    def get_filters_params(self, params: Any = None) -> dict[str, Any]:
        lookup_params: dict[str, Any] = super().get_filters_params(params)
        lookup_params.pop(COUNT_VAR, None)
        return lookup_params

    def exact_count_url(self) -> str:
        """Return this page's URL asking for an exact count."""
        return str(self.get_query_string({COUNT_VAR: "exact"}))
