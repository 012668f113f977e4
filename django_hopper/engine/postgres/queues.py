"""Queue controls of the PostgreSQL engine: the limited claim, ordering keys,
aging, pause, resume and limits (SQL in ``queries/queues.sql``)."""

from __future__ import annotations

import datetime as dt

from django_hopper.engine import limits as rules
from django_hopper.engine.decode import runnable
from django_hopper.engine.params import (
    JobAgeParams,
    JobClaimParams,
    JobClaimResult,
    JobRetryOrderingKeyParams,
    QueueState,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.convert import job_from_row
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.engine.postgres.workflows import attach_dependencies
from django_hopper.types import (
    QueueLimits,
    QueueRow,
)


class QueuesMixin(PostgresSupport):
    """Queue controls and the limited claim path."""

    # -- the limited claim ----------------------------------------------------

    def _job_claim_limited(self, params: JobClaimParams) -> JobClaimResult:
        """Claim through the limited path.

        The limited path locks the queue row, so claims of one limited queue
        serialize; the plan (global limit, token bucket, wait) comes from
        :mod:`django_hopper.engine.limits`, the partition limit from the claim
        statement, and the bucket is written back in the same transaction.
        """
        queue = params.queue
        with db_errors(), self._atomic():
            row = self._fetchone("job_claim.lock", {"queue": queue, "now": params.now})
            state: QueueState | None = None
            plan: rules.ClaimPlan | None = None
            if row is None:  # no row, no limits: claim as the plain path would
                want, partition_limit = params.limit, 0
            else:
                state = QueueState(
                    limits=convert.queue_from_row((queue, None, None, *row[1:6])).limits,
                    paused=bool(row[0]),
                    rate_tokens=row[6],
                    rate_refilled_at=row[7],
                    running=int(self._fetchone("job_claim.running", {"queue": queue})[0]),  # type: ignore[index]
                    now=row[8],
                )
                plan = rules.plan_claim(state, params.limit)
                if plan.limit == 0:
                    return JobClaimResult(jobs=[], wait=plan.wait)
                want, partition_limit = plan.limit, state.limits.partition_limit
            rows = self._fetchall(
                "job_claim.limited",
                {
                    "queue": queue,
                    "client_id": params.client_id,
                    "limit": want,
                    "free": want,
                    "now": params.now,
                    "scan": rules.partition_scan(want, partition_limit),
                    "partition_limit": partition_limit,
                },
                prepare=True,
            )
            if state is not None and plan is not None and plan.tokens is not None:
                self._execute(
                    "job_claim.spend",
                    {"queue": queue, "tokens": rules.spend(plan, len(rows)), "at": state.now},
                )
        jobs = runnable(self, params, [job_from_row(r) for r in rows])
        return JobClaimResult(jobs=attach_dependencies(self, jobs))

    # -- ordering keys and aging ----------------------------------------------

    def _job_retry_ordering_key(self, params: JobRetryOrderingKeyParams) -> int:
        """Wake an ordering key's waiting jobs and mark its running one, in one statement."""
        queue, key = params.queue, params.ordering_key
        row = self._fetchone(
            "job_retry_ordering_key",
            {"queue": queue, "ordering_key": key, "limit": params.limit, "now": params.now},
        )
        return int(row[0]) if row else 0

    def _job_age(self, params: JobAgeParams) -> int:
        """Raise the priority of the queue's long-claimable jobs by one level."""
        queue, after = params.queue, params.after
        return self._execute("job_age", {"queue": queue, "after": after, "now": params.now})

    # -- pause, resume, limits ------------------------------------------------

    def _queue_pause(self, name: str, now: dt.datetime | None = None) -> None:
        """Mark the queue paused (keeping an earlier pause time) and signal the clients."""
        self._execute("queue_pause", {"name": name, "now": now})

    def _queue_resume(self, name: str, now: dt.datetime | None = None) -> None:
        """Clear the queue's pause and signal the clients."""
        self._execute("queue_resume", {"name": name, "now": now})

    def _queue_set_limits(self, limits: QueueLimits, now: dt.datetime | None = None) -> QueueRow:
        """Store validated limits (zero removes one), reset the bucket, signal the clients."""
        checked = limits
        with db_errors(), self._atomic():
            row = self._fetchone(
                "queue_set_limits",
                {
                    "name": checked.name,
                    "global_limit": checked.global_limit,
                    "rate_per_sec": checked.rate_per_sec,
                    "rate_burst": checked.rate_burst,
                    "partition_limit": checked.partition_limit,
                    "aging": checked.aging if checked.aging > dt.timedelta(0) else None,
                    "now": now,
                },
            )
            assert row is not None
        return convert.queue_from_row(row)

    def _queue_get(self, name: str) -> QueueRow | None:
        """Return one queue's row, or None."""
        row = self._fetchone("queue_get", {"name": name})
        return convert.queue_from_row(row) if row else None
