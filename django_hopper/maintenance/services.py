"""The leader's services for jobs, workflows, streams and clients, and the list the
leader runs. Each has ``run_once()`` so tests call it directly; the periodic-job
service is in :mod:`.periodic`, the history and table services in :mod:`.history`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from django_hopper import registry, signals
from django_hopper.conf import hopper_settings
from django_hopper.engine.params import (
    BatchSettleParams,
    JobAgeParams,
    JobDiscardExpiredParams,
    JobExpireLeasesParams,
    JobFinalize,
    JobFinalizeParams,
    JobPassMissParams,
    JobPassTakeoverParams,
    JobRescueParams,
    JobScheduleParams,
    StreamPruneParams,
    WorkflowPromoteParams,
)
from django_hopper.engine.rules import attempt_error, rescued_state
from django_hopper.engine.topics import pattern_matches
from django_hopper.maintenance.base import UPKEEP_FIRST_DELAY, Service
from django_hopper.maintenance.history import HistoryIndexer, HistoryPruner, Vacuumer
from django_hopper.maintenance.periodic import PeriodicEnqueuer
from django_hopper.retry import backoff
from django_hopper.types import JobState, RescueReason

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.engine.params import RescueCandidate
    from django_hopper.types import JobID, JobRow

logger = logging.getLogger("django_hopper.maintenance")


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
        error = attempt_error(job, message, rescue=reason, by=job.attempted_by)
        state = rescued_state(job)
        return JobFinalize(
            id=job.id,
            attempted_by=job.attempted_by,
            fence=job.fence,
            state=state,
            delay=backoff(job.attempt) if state == JobState.RETRYABLE else dt.timedelta(0),
            error=error,
        )

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Rescue one batch of candidates; return how many were ended."""
        candidates = self.engine.job_rescue_candidates(
            JobRescueParams(stuck_after=dt.timedelta(seconds=self.stuck_after), now=now)
        )
        if not candidates:
            return 0
        kinds = set(registry.resumable())
        missed = sum(
            self.miss(c, c.job.kind not in kinds)
            for c in candidates
            if c.ahead or c.job.kind in kinds
        )
        candidates = [c for c in candidates if not c.ahead and c.job.kind not in kinds]
        if not candidates:
            return missed
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
        ended = [
            _ended_row(c.job, f, now)
            for c, f in zip(candidates, finals, strict=True)
            if (f.id, f.fence) in done and f.state in (JobState.CANCELED, JobState.DISCARDED)
        ]
        announce_endings(ended)
        if signals.jobs_rescued.receivers:
            signals.send_logged(
                signals.jobs_rescued,
                jobs=[
                    dataclasses.replace(c.job, state=f.state)
                    for c, f in zip(candidates, finals, strict=True)
                    if (f.id, f.fence) in done
                ],
            )
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
        return len(done) + missed

    def miss(self, candidate: RescueCandidate, ahead: bool = False) -> int:
        """End a claim that never began, or may not have: an admission miss, no attempt.

        A resumable pass BEGINs by turning its worker's claim into a pass lease,
        which the rescue never touches; a candidate of a resumable kind is
        therefore still a client's claim whose handler never started (its
        worker died, hung or was stopped before BEGIN). A job its worker
        claimed ahead of a free slot (``ahead``) may or may not have left the
        worker's buffer, and nothing tells which: it is counted the same way,
        never charged an attempt. Returns 1 if it ended.
        """
        job = candidate.job
        what = "was stuck" if candidate.stuck else f"(client {job.attempted_by}) stopped renewing"
        missed = self.engine.job_pass_miss(
            JobPassMissParams(
                id=job.id,
                attempted_by=job.attempted_by,
                fence=job.fence,
                max_misses=int(hopper_settings.ADMISSION_MISS_MAX),
                reason=(
                    f"the worker {what} holding it claimed ahead of a free slot"
                    if ahead
                    else f"the worker {what} before the pass began"
                ),
                ahead=ahead,
            )
        )
        if missed is None:
            return 0
        logger.warning(
            "rescued %s %s (%s) %s: admission miss %d%s",
            "job" if ahead else "run",
            job.id,
            job.kind,
            "claimed ahead of a free slot" if ahead else "before its pass began",
            missed.misses,
            (", the job is discarded" if ahead else ", the run fails") if missed.failed else "",
        )
        return 1


def _ended_row(job: JobRow, final: JobFinalize, now: dt.datetime | None) -> JobRow:
    """Return a rescued job as its rescue ended it (without reading it back)."""
    at = now or dt.datetime.now(dt.UTC)
    errors = list(job.errors)
    if final.error is not None:
        errors.append(dataclasses.replace(final.error, at=at))
    return dataclasses.replace(job, state=final.state, errors=errors, finalized_at=at)


def announce_endings(rows: Sequence[JobRow]) -> None:
    """Send ``jobs_ended`` for the jobs a service just ended outside any attempt.

    No worker announces them: the rescue ends an attempt whose worker is gone,
    expiry ends a job that never ran. Receivers (the Django Tasks backend
    sends ``task_finished`` from one) run in the leader's process; one that
    raises is logged and never stops the service. Free without receivers.
    """
    ended = [
        r for r in rows if r.state in (JobState.COMPLETED, JobState.CANCELED, JobState.DISCARDED)
    ]
    if ended:
        signals.send_logged(signals.jobs_ended, jobs=ended)


class Scheduler(Service):
    """Make due scheduled and retryable jobs available (workers claim them either way;
    this keeps listings honest and wakes nothing up late)."""

    name = "schedule"

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Promote due jobs; return how many."""
        return self.engine.job_schedule(JobScheduleParams(now=now))


class LeaseExpirer(Service):
    """End the attempts of jobs claimed by ID whose job leases are due.

    The engine decides what is due and how each attempt ends (retryable at
    once, discarded on the last attempt, canceled on request); this service
    only calls it as the leader, whose own client lease must be live. The grace
    is the longer of the client and leader TTLs: after an outage, a holder gets
    at least one renewal period past the first client's start to renew.
    """

    name = "expire_leases"

    def __init__(self, engine: BaseEngine, client_id: Callable[[], int | None]) -> None:
        super().__init__(engine)
        self.client_id = client_id

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Expire one batch of due job leases; return how many attempts ended."""

        client_id = self.client_id()
        if client_id is None:
            return 0
        grace = dt.timedelta(
            seconds=max(float(hopper_settings.CLIENT_TTL), float(hopper_settings.LEADER_TTL))
        )
        # Pass leases end at their expiry, no grace: a pass that had begun is
        # charged, a claim that never began is an admission miss.
        taken = len(
            self.engine.job_pass_takeover_many(
                JobPassTakeoverParams(
                    kinds=registry.resumable(),
                    limit=1000,
                    max_misses=int(hopper_settings.ADMISSION_MISS_MAX),
                    now=now,
                )
            )
        )
        params = JobExpireLeasesParams(limit=1000, client_id=client_id, grace=grace, now=now)
        rows = self.engine.job_expire_leases(params)
        announce_endings(rows)
        return taken + len(rows)


class ExpiredJobDiscarder(Service):
    """Discard waiting jobs whose TTL passed before they could run."""

    name = "expire"

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Discard one batch of expired jobs; return how many."""
        rows = self.engine.job_discard_expired(JobDiscardExpiredParams(now=now))
        announce_endings(rows)
        return len(rows)


class Ager(Service):
    """Raise waiting jobs' priority in queues with ``aging``, once per aging interval.

    A job claimable for longer than the queue's interval gains one level each
    interval (up to 100), so low priorities cannot starve. The last run per
    queue is kept by database time; a new leader ages at once, which at
    worst gives one level early.
    """

    name = "age"

    def __init__(self, engine: BaseEngine) -> None:
        super().__init__(engine)
        self.last: dict[str, dt.datetime] = {}

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Age the queues whose interval has passed; return how many jobs were raised."""

        engine = self.engine
        at = now or self.engine.now()
        total = 0
        for queue in self.engine.queue_list():
            aging = queue.limits.aging
            if aging <= dt.timedelta(0):
                self.last.pop(queue.name, None)
                continue
            previous = self.last.get(queue.name)
            if previous is not None and at - previous < aging:
                continue
            total += engine.job_age(JobAgeParams(queue=queue.name, after=aging, now=now))
            self.last[queue.name] = at
        return total


class ClientPruner(Service):
    """Delete client leases that expired (after their jobs were rescued)."""

    name = "prune_clients"
    interval = 30.0

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete expired client rows; return how many."""
        return self.engine.client_prune_expired(now)


class WorkflowSweeper(Service):
    """Promote workflow steps and settle batches that concurrent finalizes left behind.

    The client that finalizes jobs promotes their dependents and settles their
    batches itself; this sweep catches what a crash or a race between clients
    left: one chunk of each per round, cursors kept between rounds.
    """

    name = "workflows"
    interval = 1.0
    #: Dependency results of finished workflows are pruned this often (seconds).
    results_interval = 60.0

    def __init__(self, engine: BaseEngine, chunk: int = 1000) -> None:
        super().__init__(engine)
        self.chunk = chunk
        self._promote_after: JobID | None = None
        self._settle_after: JobID | None = None
        self._results_at = 0.0

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Sweep one chunk of pending steps and of open batches; return rows changed."""

        engine = self.engine
        promoted = engine.workflow_promote_ready(
            WorkflowPromoteParams(after=self._promote_after, limit=self.chunk, now=now)
        )
        self._promote_after = promoted.last if promoted.scanned >= self.chunk else None
        results = time.monotonic() - self._results_at >= self.results_interval
        if results:
            self._results_at = time.monotonic()
        settled = engine.batch_settle(
            BatchSettleParams(after=self._settle_after, limit=self.chunk, results=results, now=now)
        )
        self._settle_after = settled.last if settled.folded >= self.chunk else None
        return promoted.promoted + promoted.failed + settled.completed


class StreamPumper(Service):
    """Turn every stream consumer's new events into delivery jobs, each round.

    One pump per consumer per round, of at most ``HOPPER["STREAM_PUMP_LIMIT"]``
    events; a consumer with more catches up over the next rounds. Paused
    consumers are skipped. A pump that fails, whatever it raises, is logged
    and retried next round without holding up the others (an event that does
    not decode is delivered as a failure, never raised).

    An append's notification (``CHANNEL_STREAM``, PostgreSQL) names its topic:
    the maintainer then pumps at once only the consumers whose pattern matches
    one of the topics woken (``run_once(topics=...)``), instead of waiting
    for the round.
    """

    name = "stream_pump"
    #: Every maintenance round: the round's interval is the delivery latency.
    interval = 0.0

    def __init__(self, engine: BaseEngine, limit: int | None = None) -> None:
        super().__init__(engine)
        self.limit = int(hopper_settings.STREAM_PUMP_LIMIT if limit is None else limit)

    def run_once(
        self, now: dt.datetime | None = None, topics: Collection[str] | None = None
    ) -> int:
        """Pump each consumer once (with ``topics``, only those whose pattern matches
        one of them); return how many deliveries were inserted."""

        engine = self.engine
        total = 0
        for consumer in engine.stream_consumer_list():
            if consumer.paused_at is not None:
                continue
            if topics is not None and not any(pattern_matches(consumer.pattern, t) for t in topics):
                continue
            # Whatever one consumer's pump raises, the others are pumped this round.
            try:
                total += engine.stream_pump(consumer.name, self.limit, now).delivered
            except Exception:
                logger.exception("pumping stream consumer %s failed", consumer.name)
        return total


class StreamPruner(Service):
    """Delete stream events older than ``HOPPER["STREAM_RETENTION"]`` (0 keeps them)."""

    name = "stream_retention"
    interval = 60.0
    first_delay = UPKEEP_FIRST_DELAY

    def __init__(
        self,
        engine: BaseEngine,
        retention: float | None = None,
        chunk: int = 5_000,
        max_chunks: int = 20,
    ) -> None:
        super().__init__(engine)
        value = hopper_settings.STREAM_RETENTION if retention is None else retention
        self.retention = float(value or 0)
        self.chunk = chunk
        self.max_chunks = max_chunks

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete expired events a chunk at a time; return how many."""

        engine = self.engine
        if self.retention <= 0:
            return 0
        params = StreamPruneParams(
            retention=dt.timedelta(seconds=self.retention), limit=self.chunk, now=now
        )
        total = 0
        for _ in range(self.max_chunks):
            pruned = engine.stream_prune(params)
            total += pruned
            if pruned < self.chunk:
                break
        return total


def default_services(
    engine: BaseEngine, client_id: Callable[[], int | None] | None = None
) -> list[Service]:
    """Return the services the leader runs, rescue first.

    ``client_id`` (the leader's current client ID) enables periodic jobs,
    which are registered and inserted under a client lease.
    """
    services: list[Service] = [
        Rescuer(engine),
        Scheduler(engine),
        ExpiredJobDiscarder(engine),
        WorkflowSweeper(engine),
        StreamPumper(engine),
        ClientPruner(engine),
        Ager(engine),
    ]
    if client_id is not None:
        services.insert(1, LeaseExpirer(engine, client_id))
        # Periodic jobs are inserted through HOPPER["DATABASE"]; a leader of
        # another database (hopper_worker --database) inserting them too
        # would run each slot twice.
        if engine.alias == hopper_settings.DATABASE:
            services.append(PeriodicEnqueuer(engine, client_id))
    services += [HistoryPruner(engine), Vacuumer(engine)]
    services.append(StreamPruner(engine))
    services.append(HistoryIndexer(engine))
    return services
