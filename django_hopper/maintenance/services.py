"""The leader's periodic services. Each has ``run_once()`` so tests call it directly."""

from __future__ import annotations

import datetime as dt
import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from django_hopper.conf import hopper_settings
from django_hopper.engine.base import (
    AttemptError,
    JobDiscardExpiredParams,
    JobFinalize,
    JobFinalizeParams,
    JobRescueParams,
    JobScheduleParams,
    RescueReason,
)
from django_hopper.retry import backoff

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine, RescueCandidate

logger = logging.getLogger("django_hopper.maintenance")


class Service(ABC):
    """A periodic task of the leader."""

    #: A short name for logs and ``hopper_maintain`` output.
    name: str = ""
    #: Seconds between runs (the maintainer's loop interval bounds it from below).
    interval: float = 1.0

    def __init__(self, engine: BaseEngine) -> None:
        self.engine = engine

    @abstractmethod
    def run_once(self, now: dt.datetime | None = None) -> int:
        """Do one round of work; return how many rows it changed."""


class Rescuer(Service):
    """End the attempts of running jobs whose worker is gone or that are stuck.

    Each candidate is finalized fenced to the claim it was found in (its
    ``attempted_by`` and ``fence``), so a worker that comes back and reports
    late is refused, and a job that finished in the meantime is left alone.
    The outcome follows the worker's rule: retry after backoff, discard when
    out of attempts, cancel if a cancel was requested.
    """

    name = "rescue"

    def __init__(self, engine: BaseEngine, stuck_after: float | None = None) -> None:
        super().__init__(engine)
        value = hopper_settings.RESCUE_STUCK_AFTER if stuck_after is None else stuck_after
        self.stuck_after = float(value or 0)

    def outcome(self, candidate: RescueCandidate) -> JobFinalize:
        """Return the result the rescue records for one candidate."""
        job = candidate.job
        if candidate.stuck:
            reason = RescueReason.STUCK
            message = f"stuck: still running {self.stuck_after:g}s after it was claimed"
        else:
            reason = RescueReason.CLIENT_EXPIRED
            message = f"the worker (client {job.attempted_by}) stopped renewing its lease"
        error = AttemptError(
            at=None, attempt=job.attempt, error=message, fence=job.fence, rescue=reason
        )
        if job.cancel_requested_at is not None:
            state, delay = "canceled", None
        elif job.attempt >= job.max_attempts:
            state, delay = "discarded", None
        else:
            state, delay = "retryable", backoff(job.attempt)
        return JobFinalize(
            id=job.id,
            attempted_by=job.attempted_by,
            fence=job.fence,
            state=state,
            delay=delay or dt.timedelta(0),
            error=error,
        )

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Rescue one batch of candidates; return how many were ended."""
        candidates = self.engine.job_rescue_candidates(
            JobRescueParams(stuck_after=dt.timedelta(seconds=self.stuck_after), now=now)
        )
        if not candidates:
            return 0
        finals = [self.outcome(c) for c in candidates]
        applied = self.engine.job_finalize_many(
            JobFinalizeParams(
                jobs=finals,
                no_batches=all(c.job.batch_id is None for c in candidates),
                keep_logs=int(hopper_settings.KEEP_LOGS),
                now=now,
            )
        )
        done = {(f.id, f.fence) for f in applied}
        for c, f in zip(candidates, finals, strict=True):
            if (f.id, f.fence) in done:
                logger.warning(
                    "rescued job %s (%s, attempt %d, fence %d): %s -> %s",
                    c.job.id,
                    c.job.kind,
                    c.job.attempt,
                    c.job.fence,
                    f.error.rescue if f.error else "",
                    f.state,
                )
        return len(done)


class Scheduler(Service):
    """Make due scheduled and retryable jobs available (workers claim them either way;
    this keeps listings honest and wakes nothing up late)."""

    name = "schedule"

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Promote due jobs; return how many."""
        return self.engine.job_schedule(JobScheduleParams(now=now))


class ExpiredJobDiscarder(Service):
    """Discard waiting jobs whose TTL passed before they could run."""

    name = "expire"

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Discard one batch of expired jobs; return how many."""
        return len(self.engine.job_discard_expired(JobDiscardExpiredParams(now=now)))


class ClientPruner(Service):
    """Delete client leases that expired (after their jobs were rescued)."""

    name = "prune_clients"
    interval = 30.0

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete expired client rows; return how many."""
        return self.engine.client_prune_expired(now)


def default_services(engine: BaseEngine) -> list[Service]:
    """Return the services the leader runs, rescue first."""
    return [Rescuer(engine), Scheduler(engine), ExpiredJobDiscarder(engine), ClientPruner(engine)]
