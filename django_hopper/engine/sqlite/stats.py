"""Stats of the SQLite engine (SQL in ``queries/stats.sql``)."""

from __future__ import annotations

import datetime as dt

from django_hopper.engine.sqlite.convert import db_time, from_db_time
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.types import QueueStats, Stats


class StatsMixin(SQLiteSupport):
    """Queue depths and cluster state, read in one transaction."""

    def _stats(self, now: dt.datetime | None = None) -> Stats:
        """Read per-queue depths, then the clients, the leader and running per client."""
        return self._read_stats("stats", now, {})

    def _stats_bounded(self, window: int, now: dt.datetime | None = None) -> Stats:
        """Read per-queue depths counted up to ``window`` each, then the cluster."""
        return self._read_stats("stats_bounded", now, {"window": window})

    @translate_errors
    def _read_stats(self, name: str, now: dt.datetime | None, extra: dict[str, object]) -> Stats:
        """Run one depths statement and the cluster reads in one transaction."""
        at, now_s = self._now(now)
        args = {"now": now_s, "minute_ago": db_time(at - dt.timedelta(minutes=1)), **extra}
        with self._atomic(), self._cursor() as c:
            c.execute(Q[name], args)
            queues = c.fetchall()
            c.execute(Q["stats.clients"], args)
            clients = c.fetchone()
            c.execute(Q["stats.running"], args)
            running = c.fetchall()
        out = Stats()
        for r in queues:
            oldest = from_db_time(r[5]) if r[5] else None
            out.queues[r[0]] = QueueStats(
                available=int(r[1]),
                scheduled=int(r[2]),
                retryable=int(r[3]),
                running=int(r[4]),
                oldest_available=max(at - oldest, dt.timedelta(0)) if oldest else dt.timedelta(0),
                completed_last_minute=int(r[6]),
                paused=bool(r[7]),
            )
        out.live_clients = int(clients[0])
        out.leader = int(clients[1]) if clients[1] is not None else None
        out.running_by_client = {int(k): int(v) for k, v in running}
        return out
