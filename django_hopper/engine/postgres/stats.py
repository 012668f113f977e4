"""Stats of the PostgreSQL engine (SQL in ``queries/stats.sql``)."""

from __future__ import annotations

import datetime as dt

from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.types import QueueStats, Stats


class StatsMixin(PostgresSupport):
    """Queue depths and cluster state, read in one transaction."""

    def _stats(self, now: dt.datetime | None = None) -> Stats:
        """Read per-queue depths, then the clients, the leader and running per client."""
        return self._read_stats("stats", {"now": now})

    def _stats_bounded(self, window: int, now: dt.datetime | None = None) -> Stats:
        """Read per-queue depths counted up to ``window`` each, then the cluster."""
        return self._read_stats("stats_bounded", {"now": now, "window": window})

    def _read_stats(self, name: str, args: dict[str, object]) -> Stats:
        """Run one depths statement and the cluster read in one transaction."""
        with db_errors(), self._atomic():
            queues = self._fetchall(name, args)
            cluster = self._fetchone("stats.cluster", {"now": args["now"]})
        out = Stats()
        for r in queues:
            out.queues[r[0]] = QueueStats(
                available=int(r[1]),
                scheduled=int(r[2]),
                retryable=int(r[3]),
                running=int(r[4]),
                oldest_available=r[5] or dt.timedelta(0),
                completed_last_minute=int(r[6]),
                paused=bool(r[7]),
            )
        if cluster is not None:
            out.live_clients = int(cluster[0])
            out.leader = int(cluster[1]) if cluster[1] is not None else None
            out.running_by_client = {
                int(k): int(v) for k, v in (convert.load_json(cluster[2]) or {}).items()
            }
        return out
