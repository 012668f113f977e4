"""The overview page: every queue at a glance, the last hour charted, the clients and the leader.

It reads the cluster's stats once (the engine's bounded depth counts:
``stats_bounded``, each queue's count of a state exact up to
``common.DEPTH_LIMIT``, then estimated), the last hour of history once (grouped by
queue, minute and state, served by the ``finalized_at`` index), and the
small queues and clients tables: its cost follows the number of queues and
the last hour's finishes, never the number of live jobs or the history's size.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F
from django.db.models.functions import TruncMinute
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.safestring import SafeString

from django_hopper.admin import common
from django_hopper.admin.common import (
    DEPTH_STATES,
    admin_url,
    depth_texts,
    read_stats,
    seconds_text,
    time_text,
)
from django_hopper.admin.graph import bar_chart
from django_hopper.engine import get_engine
from django_hopper.models import Client, JobHistory, Queue
from django_hopper.types import QueueStats

#: How far back the charts look, and the width of one bar.
WINDOW = dt.timedelta(hours=1)
BUCKET = dt.timedelta(minutes=1)
#: How often the page refreshes itself while live refresh is on.
REFRESH_SECONDS = 5


@dataclass
class QueueLine:
    """One queue's row on the overview."""

    name: str
    depths: QueueStats
    paused: bool
    limits: str
    #: Each state's count as shown: exact, ``about N`` or ``N+`` (``depth_texts``).
    counts: dict[str, str] = field(default_factory=dict)
    completed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    pickup: dt.timedelta | None = None
    links: dict[str, str] = field(default_factory=dict)

    @property
    def completed_total(self) -> int:
        return sum(self.completed)

    @property
    def failed_total(self) -> int:
        return sum(self.failed)

    @property
    def chart(self) -> SafeString:
        label = f"{self.name}: {self.completed_total} completed, {self.failed_total} failed"
        return bar_chart(self.completed, self.failed, width=122, label=label + " in the last hour")

    @property
    def oldest(self) -> str:
        if not self.depths.available:
            return "-"
        return seconds_text(round(self.depths.oldest_available.total_seconds(), 1))

    @property
    def pickup_text(self) -> str:
        return seconds_text(round(self.pickup.total_seconds(), 2)) if self.pickup else "-"


def limits_text(queue: Queue | None) -> str:
    """Describe a queue's limits in a few words."""
    if queue is None:
        return "-"
    parts = []
    if queue.global_limit:
        parts.append(f"{queue.global_limit} running")
    if queue.rate_per_sec:
        parts.append(f"{queue.rate_per_sec:g}/s")
    if queue.partition_limit:
        parts.append(f"{queue.partition_limit} per partition")
    if queue.aging:
        parts.append(f"aging {seconds_text(queue.aging)}")
    return ", ".join(parts) or "-"


def last_hour(now: dt.datetime) -> dict[str, tuple[list[int], list[int], dt.timedelta | None]]:
    """Return, per queue, completed and failed counts per minute and the average pickup wait."""
    since = now - WINDOW
    buckets = int(WINDOW / BUCKET)
    start = since.replace(second=0, microsecond=0)
    wait = ExpressionWrapper(F("attempted_at") - F("scheduled_at"), output_field=DurationField())
    rows = (
        JobHistory.objects.filter(finalized_at__gt=since)
        .annotate(minute=TruncMinute("finalized_at"))
        .values("queue", "minute", "state")
        .annotate(n=Count("id"), wait=Avg(wait))
        .order_by()
    )
    completed: dict[str, list[int]] = defaultdict(lambda: [0] * (buckets + 1))
    failed: dict[str, list[int]] = defaultdict(lambda: [0] * (buckets + 1))
    waits: dict[str, list[tuple[int, dt.timedelta]]] = defaultdict(list)
    for row in rows:
        minute = row["minute"]
        if minute is None:
            continue
        index = min(max(int((minute - start) / BUCKET), 0), buckets)
        if row["state"] == "completed":
            completed[row["queue"]][index] += row["n"]
            if row["wait"] is not None:
                waits[row["queue"]].append((row["n"], row["wait"]))
        else:
            failed[row["queue"]][index] += row["n"]
    out: dict[str, tuple[list[int], list[int], dt.timedelta | None]] = {}
    for name in set(completed) | set(failed):
        pairs = waits.get(name, [])
        count = sum(n for n, _ in pairs)
        pickup = sum((w * n for n, w in pairs), dt.timedelta(0)) / count if count else None
        out[name] = (completed[name], failed[name], pickup)
    return out


def overview_context(model_admin: admin.ModelAdmin, request: HttpRequest) -> dict[str, Any]:
    """Read what the overview shows: a stats read, the last hour, the queues and clients."""

    now = get_engine().now()
    stats = read_stats(model_admin, request)
    rows = {q.name: q for q in Queue.objects.all()}
    hour = last_hour(now)
    texts = depth_texts(stats)
    empty = ([0] * 61, [0] * 61, None)
    lines = []
    for name in sorted(set(stats.queues) | set(rows) | set(hour)):
        depths = stats.queues.get(name, QueueStats())
        row = rows.get(name)
        done, bad, pickup = hour.get(name, empty)
        live = admin_url("job", "changelist")
        lines.append(
            QueueLine(
                name=name,
                depths=depths,
                paused=bool(row and row.paused_at) or depths.paused,
                limits=limits_text(row),
                counts=texts.get(name) or dict.fromkeys(DEPTH_STATES, "0"),
                completed=done,
                failed=bad,
                pickup=pickup,
                links={
                    state: f"{live}?{urlencode({'queue': name, 'state': state})}"
                    for state in ("available", "scheduled", "retryable", "running")
                }
                | {
                    "history": admin_url("jobhistory", "changelist")
                    + "?"
                    + urlencode({"queue": name}),
                    "failed": admin_url("jobhistory", "changelist")
                    + "?"
                    + urlencode({"queue": name, "state": "discarded"}),
                    "queue": admin_url("queue", "change", name) if row else "",
                },
            )
        )
    clients = [
        {
            "id": c.id,
            "hostname": c.hostname,
            "leader": stats.leader == c.id,
            "running": stats.running_by_client.get(c.id, 0),
            "running_url": f"{admin_url('job', 'changelist')}?state=running&attempted_by={c.id}",
            "url": admin_url("client", "change", c.id),
            "started": time_text(c.started_at),
            "expires": time_text(c.expires_at),
        }
        for c in Client.objects.filter(expires_at__gt=now).order_by("id")[:100]
    ]
    return {
        "lines": lines,
        "clients": clients,
        "leader": stats.leader,
        "now": time_text(now),
        "window_minutes": int(WINDOW / BUCKET),
        "depth_limit": common.DEPTH_LIMIT,
    }


def overview_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Render the overview, or only its body for the live refresh (``?partial=1``)."""
    context = overview_context(model_admin, request)
    if request.GET.get("partial"):
        return TemplateResponse(request, "admin/django_hopper/overview_body.html", context)
    page = {
        **model_admin.admin_site.each_context(request),
        **context,
        "opts": model_admin.opts,
        "title": "Hopper overview",
        "refresh_seconds": REFRESH_SECONDS,
        "partial_url": admin_url("queue", "overview") + "?partial=1",
    }
    return TemplateResponse(request, "admin/django_hopper/overview.html", page)


__all__ = ["overview_view"]
