"""Queue controls of the SQLite engine: the limited claim, ordering keys, aging,
pause, resume and limits (SQL in ``queries/queues.sql``).

SQLite has no notifications, so pause, resume and limits reach the workers
through their lease renewal; ``notify`` is still called, as the contract says.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django_hopper.engine import limits as rules
from django_hopper.engine.decode import runnable
from django_hopper.engine.params import (
    JobAgeParams,
    JobClaimParams,
    JobClaimResult,
    JobRetryOrderingKeyParams,
    QueueState,
)
from django_hopper.engine.sqlite.convert import db_time, from_db_time, job_from_row
from django_hopper.engine.sqlite.jobs import _claim_key
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.engine.sqlite.workflows import attach_dependencies
from django_hopper.types import QueueLimits, QueueRow


def _limits(name: str, r: Sequence[Any]) -> QueueLimits:
    """Build QueueLimits from (global, rate, burst, partition, aging µs); NULL is no limit."""
    return QueueLimits(
        name=name,
        global_limit=r[0] or 0,
        rate_per_sec=r[1] or 0.0,
        rate_burst=r[2] or 0,
        partition_limit=r[3] or 0,
        aging=dt.timedelta(microseconds=r[4]) if r[4] else dt.timedelta(0),
    )


def _queue_row(r: Sequence[Any]) -> QueueRow:
    return QueueRow(
        name=r[0],
        paused_at=from_db_time(r[1]),
        updated_at=from_db_time(r[2]),
        limits=_limits(r[0], r[3:8]),
    )


class QueuesMixin(SQLiteSupport):
    """Queue controls and the limited claim path."""

    # -- the limited claim ----------------------------------------------------

    @translate_errors
    def _job_claim_limited(self, params: JobClaimParams) -> JobClaimResult:
        """Claim through the limited path.

        The IMMEDIATE transaction holds the write lock from its start, so the
        queue row read here cannot change before the claim and the bucket's
        update commit; the plan comes from :mod:`django_hopper.engine.limits`.
        """
        queue = params.queue
        with self._atomic(), self._hot_cursor() as c:
            now, now_s = self._now(params.now)  # under the write lock: commit order
            c.execute(Q["job_claim.lock"], {"queue": queue})
            row = c.fetchone()
            state: QueueState | None = None
            plan: rules.ClaimPlan | None = None
            want, partition_limit = params.limit, 0
            if row is not None:
                state = QueueState(
                    limits=_limits(queue, row[1:6]),
                    paused=bool(row[0]),
                    rate_tokens=row[6],
                    rate_refilled_at=from_db_time(row[7]) if row[7] else None,
                    running=int(row[8]),
                    now=now,
                )
                plan = rules.plan_claim(state, params.limit)
                if plan.limit == 0:
                    return JobClaimResult(jobs=[], wait=plan.wait)
                want, partition_limit = plan.limit, state.limits.partition_limit
            args = {
                "queue": queue,
                "now": now_s,
                "client_id": params.client_id,
                "limit": want,
                "free": want,
                "scan": rules.partition_scan(want, partition_limit),
                "partition_limit": partition_limit,
                "limited": True,
            }
            c.execute(Q["job_claim.promote"], args)
            c.execute(Q["job_claim"], args)
            jobs = [job_from_row(r) for r in c.fetchall()]
            if plan is not None and plan.tokens is not None:
                c.execute(
                    Q["job_claim.spend"],
                    {"queue": queue, "tokens": rules.spend(plan, len(jobs)), "at": now_s},
                )
        jobs.sort(key=_claim_key)
        jobs = runnable(self, params, jobs)
        if any(j.batch_id is not None for j in jobs):
            jobs = attach_dependencies(self, jobs)
        return JobClaimResult(jobs=jobs)

    # -- ordering keys and aging ----------------------------------------------

    @translate_errors
    def _job_retry_ordering_key(self, params: JobRetryOrderingKeyParams) -> int:
        """Wake an ordering key's waiting jobs and mark its running one, in one transaction."""
        queue, key = params.queue, params.ordering_key
        _, now_s = self._now(params.now)
        args = {"queue": queue, "ordering_key": key, "limit": params.limit, "now": now_s}
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_retry_ordering_key"], args)
            woken = int(c.rowcount)
            c.execute(Q["job_retry_ordering_key.mark"], args)
        return woken

    @translate_errors
    def _job_age(self, params: JobAgeParams) -> int:
        """Raise the priority of the queue's long-claimable jobs by one level."""
        queue, after = params.queue, params.after
        now, now_s = self._now(params.now)
        with self._cursor() as c:
            c.execute(Q["job_age"], {"queue": queue, "now": now_s, "before": db_time(now - after)})
            return int(c.rowcount)

    # -- pause, resume, limits ------------------------------------------------

    @translate_errors
    def _queue_pause(self, name: str, now: dt.datetime | None = None) -> None:
        """Mark the queue paused (keeping an earlier pause time)."""
        _, now_s = self._now(now)
        with self._cursor() as c:
            c.execute(Q["queue_pause"], {"name": name, "now": now_s})

    @translate_errors
    def _queue_resume(self, name: str, now: dt.datetime | None = None) -> None:
        """Clear the queue's pause."""
        _, now_s = self._now(now)
        with self._cursor() as c:
            c.execute(Q["queue_resume"], {"name": name, "now": now_s})

    @translate_errors
    def _queue_set_limits(self, limits: QueueLimits, now: dt.datetime | None = None) -> QueueRow:
        """Store validated limits (zero removes one) and reset the bucket."""
        checked = limits
        _, now_s = self._now(now)
        aging = checked.aging // dt.timedelta(microseconds=1) or None
        with self._atomic(), self._cursor() as c:
            c.execute(
                Q["queue_set_limits"],
                {
                    "name": checked.name,
                    "global_limit": checked.global_limit,
                    "rate_per_sec": checked.rate_per_sec,
                    "rate_burst": checked.rate_burst,
                    "partition_limit": checked.partition_limit,
                    "aging": aging,
                    "now": now_s,
                },
            )
            row = c.fetchone()
        return _queue_row(row)

    @translate_errors
    def _queue_get(self, name: str) -> QueueRow | None:
        """Return one queue's row, or None."""
        with self._cursor() as c:
            c.execute(Q["queue_get"], {"name": name})
            row = c.fetchone()
        return _queue_row(row) if row else None
