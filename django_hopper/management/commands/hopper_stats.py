"""``manage.py hopper_stats``: queue depths and cluster state, as a table or JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_hopper.queues import stats
from django_hopper.types import Stats

_COLUMNS = ("queue", "available", "scheduled", "retryable", "running", "oldest", "done/min", "")


def stats_json(stats: Stats) -> dict[str, Any]:
    """Return the stats as plain JSON (durations in seconds)."""
    return {
        "queues": {
            name: {
                "available": q.available,
                "scheduled": q.scheduled,
                "retryable": q.retryable,
                "running": q.running,
                "oldest_available_seconds": q.oldest_available.total_seconds(),
                "completed_last_minute": q.completed_last_minute,
                "paused": q.paused,
            }
            for name, q in stats.queues.items()
        },
        "live_clients": stats.live_clients,
        "leader": stats.leader,
        "running_by_client": {str(k): v for k, v in stats.running_by_client.items()},
    }


class Command(BaseCommand):
    help = "Print per-queue depths, the oldest claimable job, completions and the cluster state."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def handle(self, *args: Any, **options: Any) -> None:
        """Read the stats once and print them."""

        result = stats()
        if options["json"]:
            self.stdout.write(json.dumps(stats_json(result), indent=2, sort_keys=True))
            return
        rows = [_COLUMNS]
        for name, q in sorted(result.queues.items()):
            rows.append(
                (
                    name,
                    str(q.available),
                    str(q.scheduled),
                    str(q.retryable),
                    str(q.running),
                    f"{q.oldest_available.total_seconds():.1f}s",
                    str(q.completed_last_minute),
                    "paused" if q.paused else "",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        for r in rows:
            self.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            )
        leader = result.leader if result.leader is not None else "none"
        self.stdout.write(f"\nlive clients: {result.live_clients}  leader: {leader}")
        for client, n in sorted(result.running_by_client.items()):
            self.stdout.write(f"  client {client}: {n} running")
