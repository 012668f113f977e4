"""The engine contract: what every database engine implements.

This is hopper's internal API between the layers above (api, runtime,
maintenance) and the SQL below. It follows the seed contract
(``shared/seeds/000_*.txt``) method by method, named entity first as River
names them (``job_claim``, ``job_finalize_many``, ``leader_attempt``), with one
frozen params dataclass per method and row dataclasses coming back.

Rules every engine keeps (ARCHITECTURE.md):

* Database time. Schedules, leases and TTLs compare against the database
  clock. Every method that reads the clock accepts ``now``; when it is set, the
  engine uses it instead, so tests never sleep.
* The caller's transaction. Methods run on the Django connection of the
  engine's alias; inside ``transaction.atomic()`` they are part of the caller's
  transaction. Methods that need several statements wrap them in an atomic
  block of their own, so they never leave a half write.
* Fences. A write an attempt makes is applied only while the job is running in
  the claim that made it.
* Errors from the driver are translated into :mod:`django_hopper.exceptions`.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from django.db import connections

from django_hopper.engine.params import (
    BatchInsertParams,
    BatchSettleParams,
    BatchSettleResult,
    ClientRegisterParams,
    ClientRenewParams,
    ClientRenewResult,
    HistoryIndexParams,
    HistoryIndexResult,
    HistoryMaintainParams,
    HistoryMaintainResult,
    JobAgeParams,
    JobCancelManyParams,
    JobCancelParams,
    JobClaimByIDParams,
    JobClaimParams,
    JobClaimResult,
    JobDeleteManyParams,
    JobDeleteParams,
    JobDiscardExpiredParams,
    JobExpireLeasesParams,
    JobFinalized,
    JobFinalizeParams,
    JobInsertOpts,
    JobInsertParams,
    JobInsertResult,
    JobLeaseRenewParams,
    JobLeaseRow,
    JobLeaseStatus,
    JobListParams,
    JobRecordProgressParams,
    JobRescueParams,
    JobRetryManyParams,
    JobRetryOrderingKeyParams,
    JobRetryParams,
    JobScheduleParams,
    JobsMaintainParams,
    JobsMaintainResult,
    JobStepGetParams,
    JobStepRecordParams,
    JobStepsClearParams,
    LeaderParams,
    MessagePublishParams,
    PeriodicInsertParams,
    PeriodicRegisterParams,
    RescueCandidate,
    StreamAppendParams,
    StreamPruneParams,
    StreamPumpResult,
    StreamReadParams,
    StreamSeekParams,
    WorkflowInsertParams,
    WorkflowInsertResult,
    WorkflowPromoteParams,
    WorkflowPromoteResult,
)
from django_hopper.exceptions import NotSupported
from django_hopper.types import (
    AttemptLog,
    BatchRow,
    ClientRow,
    HistoryPartitionRow,
    JobID,
    JobManyResult,
    JobRow,
    JobStepRow,
    Notification,
    PeriodicRegistrationRow,
    Progress,
    QueueLimits,
    QueueRow,
    Stats,
    StreamConsumerRow,
    StreamEvent,
    SubscriptionRow,
    WorkflowRow,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


@dataclass(slots=True, frozen=True)
class EngineFeatures:
    """What an engine can do (seed ``Capabilities``). Branch on these, never on vendor."""

    #: job_insert_copy is implemented (COPY on Postgres).
    supports_copy: bool = False
    #: listener() is implemented (LISTEN/NOTIFY).
    supports_listen: bool = False
    #: One writing transaction at a time (SQLite): no SKIP LOCKED needed.
    single_writer: bool = False
    #: History is partitioned by time; retention drops partitions.
    supports_history_partitions: bool = False
    #: Row locks with SKIP LOCKED / NOWAIT.
    supports_skip_locked: bool = False
    #: GIN indexes on JSON columns (tags and metadata filters).
    supports_json_indexes: bool = False
    #: Per-table storage parameters (autovacuum thresholds for the hot tables).
    supports_storage_parameters: bool = False
    #: Stream positions carry transaction ids (xid8) and consumers read through
    #: snapshots (pg_snapshot), so an event whose transaction commits late is
    #: still delivered; without it, one writer makes sequence order commit order.
    supports_xid_streams: bool = False


class Listener(ABC):
    """A dedicated connection receiving notifications."""

    @abstractmethod
    def listen(self, channels: Sequence[str]) -> None: ...

    @abstractmethod
    def next(self, timeout: float) -> list[Notification]:
        """Block up to ``timeout`` seconds; return what arrived (maybe nothing)."""

    @abstractmethod
    def close(self) -> None: ...


class BaseEngine(ABC):
    """One database engine. Stateless apart from its alias: every call uses the
    current thread's Django connection for that alias."""

    vendor: ClassVar[str]
    features: ClassVar[EngineFeatures]

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    # -- time and schema ----------------------------------------------------

    @abstractmethod
    def now(self) -> dt.datetime:
        """Return the database clock (aware, UTC)."""

    @abstractmethod
    def schema_version(self) -> int:
        """Return the number of the newest applied hopper migration, or 0.

        Takes no lock, so it never waits for a migration in progress.
        """

    # -- jobs ---------------------------------------------------------------

    @abstractmethod
    def job_insert_many(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = JobInsertOpts()
    ) -> list[JobInsertResult]:
        """Insert jobs in one statement; one result per input, in input order.

        An input whose unique key matches a live job (same kind and key), or,
        with ``unique_finished``, a job in history in one of those states, is
        not inserted; its result carries the existing job and
        ``duplicate=True``. With ConflictAction.REPLACE the existing live job's
        args, metadata, priority, max attempts and schedule are replaced unless
        it is running. Inputs are already deduplicated by unique key.
        """

    @abstractmethod
    def job_insert_copy(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = JobInsertOpts()
    ) -> list[JobInsertResult]:
        """Bulk-load jobs without conflict handling (only if ``supports_copy``)."""

    @abstractmethod
    def job_claim(self, params: JobClaimParams) -> JobClaimResult:
        """Move up to ``limit`` claimable jobs of a queue to running, atomically.

        Claimable: available, or scheduled/retryable with scheduled_at passed;
        not expired (TTL); queue not paused. Order: priority (higher first),
        then scheduled_at, then ID. Each claimed job gets fence+1, attempt+1,
        attempted_at = now, attempted_by = client, snooze reason cleared.
        """

    @abstractmethod
    def job_schedule(self, params: JobScheduleParams) -> int:
        """Make due scheduled and retryable jobs available; return how many."""

    @abstractmethod
    def job_finalize_many(self, params: JobFinalizeParams) -> list[JobFinalized]:
        """Apply a batch of results in one statement, each fenced to its claim.

        A result applies only if its job is still running, owned by the same
        client (or lease) at the same fence. Returns the applied results; the
        caller treats the rest as fenced.
        """

    @abstractmethod
    def job_record_progress(self, params: JobRecordProgressParams) -> Progress | None:
        """Store a running job's progress, fenced like a finalize.

        Returns the progress as stored, or None if the attempt no longer owns
        the job. With ``no_wait``, raises JobLocked at once if another
        transaction holds the row.
        """

    @abstractmethod
    def job_get(self, id: JobID) -> JobRow | None:
        """Return a job by ID, live or from history, or None."""

    @abstractmethod
    def job_logs(self, id: JobID) -> list[AttemptLog]:
        """Return the logs of a job's attempts, oldest first."""

    @abstractmethod
    def job_list(self, params: JobListParams) -> list[JobRow]:
        """Return live and history jobs matching the filter, in ID order."""

    @abstractmethod
    def job_cancel(self, params: JobCancelParams) -> JobRow:
        """Cancel a job; return it as it is afterwards.

        A waiting job moves to history as canceled; a running job gets a cancel
        request (cancel_requested_at) and a control notification; a finalized
        job is returned unchanged. Raises NotFound for an unknown job.
        """

    @abstractmethod
    def job_retry(self, params: JobRetryParams) -> JobRow:
        """Make a job available now.

        A canceled or discarded (or completed) job moves back from history,
        with one more attempt allowed if it had run out; a waiting job has its
        schedule brought forward. Clears the TTL. Raises JobRunning for a
        running job, UniqueConflict if a live job holds the same unique key,
        NotFound for an unknown job. Keeps progress unless ``from_start``.
        """

    @abstractmethod
    def job_delete(self, params: JobDeleteParams) -> JobRow:
        """Remove a job that is not running; return it as last stored.

        Raises JobRunning for a running job, NotFound for an unknown one.
        """

    @abstractmethod
    def job_cancel_many(self, params: JobCancelManyParams) -> JobManyResult:
        """Cancel each job as ``job_cancel`` would, set-based: a statement per call.

        Unknown jobs are reported NOT_FOUND (not raised), finished ones
        FINISHED, so one bad ID never hides what happened to the rest.
        """

    @abstractmethod
    def job_retry_many(self, params: JobRetryManyParams) -> JobManyResult:
        """Retry each job as ``job_retry`` would; its errors become RUNNING,
        UNIQUE_CONFLICT and NOT_FOUND outcomes, and those jobs are unchanged."""

    @abstractmethod
    def job_delete_many(self, params: JobDeleteManyParams) -> JobManyResult:
        """Delete each job as ``job_delete`` would; a running one is RUNNING, unchanged."""

    @abstractmethod
    def job_discard_expired(self, params: JobDiscardExpiredParams) -> list[JobRow]:
        """Move waiting jobs past their TTL to history as discarded."""

    @abstractmethod
    def job_rescue_candidates(self, params: JobRescueParams) -> list[RescueCandidate]:
        """Return running jobs whose client has no unexpired lease, plus (if
        ``stuck_after``) running jobs claimed longer ago than that; never a job
        under a job lease, which its lease governs (``job_expire_leases``), so
        that every candidate is one a finalize fenced to its claim can end."""

    # -- clients ------------------------------------------------------------

    @abstractmethod
    def client_register(self, params: ClientRegisterParams) -> int: ...

    @abstractmethod
    def client_renew(self, params: ClientRenewParams) -> ClientRenewResult: ...

    @abstractmethod
    def client_delete(self, client_id: int) -> None: ...

    @abstractmethod
    def client_prune_expired(self, now: dt.datetime | None = None) -> int: ...

    @abstractmethod
    def client_list(self) -> list[ClientRow]: ...

    # -- leader -------------------------------------------------------------

    @abstractmethod
    def leader_attempt(self, params: LeaderParams) -> bool:
        """Take or renew the leader lease; True if the client leads afterwards."""

    @abstractmethod
    def leader_resign(self, client_id: int) -> None:
        """Give up leadership if held, and signal others to elect."""

    @abstractmethod
    def leader_get(self, now: dt.datetime | None = None) -> int | None:
        """Return the leader's client ID, or None if the lease is free or expired."""

    # -- queues -------------------------------------------------------------

    @abstractmethod
    def queue_ensure(self, names: Sequence[str], now: dt.datetime | None = None) -> None: ...

    @abstractmethod
    def queue_list(self) -> list[QueueRow]: ...

    # -- notifications ------------------------------------------------------

    @abstractmethod
    def notify(self, channel: str, payloads: Sequence[str]) -> None:
        """Send notifications, delivered when the surrounding transaction
        commits. Engines without notifications do nothing."""

    def listener(self) -> Listener:
        """Open a dedicated connection for notifications."""
        raise NotSupported(f"the {self.vendor} engine has no notifications; poll instead")


class PeriodicHistoryContract:
    """Periodic slots, history retention and live-table upkeep (seed semantics).

    Ordinary methods, so that engines gain them one at a time through their
    mixins; an engine without one raises NotImplementedError.
    """

    def periodic_insert(self, params: PeriodicInsertParams) -> tuple[JobRow | None, bool]:
        """Insert the job of a slot unless that slot (or a later one) was inserted.

        Atomic: of two leaders inserting the same slot, one inserts and the
        other gets ``(None, False)``; a slot produces at most one job. Returns
        the job and True when inserted; ``(existing, False)`` when the job was a
        unique-key duplicate (the slot is still recorded).
        """
        raise NotImplementedError

    def periodic_last_slots(self) -> dict[str, dt.datetime]:
        """Return the last inserted slot per periodic job name."""
        raise NotImplementedError

    def periodic_register(self, params: PeriodicRegisterParams) -> None:
        """Replace a client's registrations atomically.

        Records none for a client whose lease expired or whose row is gone, and
        deletes the registrations of clients whose row is gone.
        """
        raise NotImplementedError

    def periodic_registrations(
        self, now: dt.datetime | None = None
    ) -> list[PeriodicRegistrationRow]:
        """Return the registrations of clients whose lease has not expired."""
        raise NotImplementedError

    def history_maintain(self, params: HistoryMaintainParams) -> HistoryMaintainResult:
        """Enforce retention on history and prepare storage ahead; idempotent."""
        raise NotImplementedError

    def history_partitions(self) -> list[HistoryPartitionRow]:
        """List history's storage units: its partitions, or the one table with its row count."""
        raise NotImplementedError

    def history_index(self, params: HistoryIndexParams) -> HistoryIndexResult:
        """Build indexes declared on history for partitions that lack them.

        Runs outside any transaction (concurrent builds); idempotent.
        """
        raise NotImplementedError

    def jobs_maintain(self, params: JobsMaintainParams | None = None) -> JobsMaintainResult:
        """Vacuum / analyze the hot tables when they need it, never waiting for a lock."""
        raise NotImplementedError


class BatchWorkflowContract(ABC):
    """Batches and workflows: every engine implements each of these."""

    @abstractmethod
    def batch_insert(self, params: BatchInsertParams) -> JobID:
        """Create a batch expecting ``total`` jobs; return its ID."""

    @abstractmethod
    def batch_settle(self, params: BatchSettleParams) -> BatchSettleResult:
        """Fold batches' recorded progress in, and complete those with no job left.

        Completing a batch inserts its callbacks in the same transaction, and
        only the transaction that completes it does, so callbacks fire once.
        """

    @abstractmethod
    def batch_get(self, id: JobID) -> BatchRow | None:
        """Return a batch's progress (folded), or None."""

    @abstractmethod
    def workflow_insert(self, params: WorkflowInsertParams) -> WorkflowInsertResult:
        """Insert a workflow's batch, jobs and edges atomically; jobs with dependencies
        start pending. Refuse an invalid workflow before writing anything."""

    @abstractmethod
    def workflow_get(self, id: JobID) -> WorkflowRow | None:
        """Return a workflow's batch, jobs (live and history), edges and step names."""

    @abstractmethod
    def workflow_promote_ready(self, params: WorkflowPromoteParams) -> WorkflowPromoteResult:
        """Promote pending jobs whose dependencies have all finalized, or fail them
        (cancel or discard, following the edge's on_failure) when one failed; the
        failure cascades down the graph within the call."""


class QueueControlsContract:
    """Ordering keys, pause, limits, aging and stats (seed semantics).

    Ordinary methods, so that engines gain them through their mixins; an
    engine without one raises NotImplementedError.
    """

    def job_retry_ordering_key(self, params: JobRetryOrderingKeyParams) -> int:
        """Wake an ordering key: up to ``limit`` of its scheduled or retryable jobs
        (oldest first, TTL not passed) become available now, keeping their TTL and
        losing their snooze reason; return how many. A running job of the key is
        marked (WAKE_MARKER) so that a snooze or retry of it is claimable at once.
        Pending and finalized jobs are left alone."""
        raise NotImplementedError

    def job_age(self, params: JobAgeParams) -> int:
        """Raise by one level (up to 100) the priority of the queue's jobs that have
        been claimable for longer than ``after``; return how many."""
        raise NotImplementedError

    def queue_pause(self, name: str, now: dt.datetime | None = None) -> None:
        """Stop every client claiming from a queue (creating its row if missing),
        and signal them on CHANNEL_CONTROL."""
        raise NotImplementedError

    def queue_resume(self, name: str, now: dt.datetime | None = None) -> None:
        """Undo queue_pause (creating the row if missing), and signal the clients."""
        raise NotImplementedError

    def queue_set_limits(self, limits: QueueLimits, now: dt.datetime | None = None) -> QueueRow:
        """Set a queue's cluster-wide limits, creating the queue if needed; zero
        removes a limit. Resets the rate limit's bucket. Signals the clients."""
        raise NotImplementedError

    def queue_get(self, name: str) -> QueueRow | None:
        """Return one queue's row, or None if it is unknown."""
        raise NotImplementedError

    def stats(self, now: dt.datetime | None = None) -> Stats:
        """Return queue depths and cluster state (seed ``Stats``)."""
        raise NotImplementedError


class LeaseStepContract(ABC):
    """Job leases and the step ledger (seed ``JobClaimByID`` ... and seed 004)."""

    @abstractmethod
    def job_claim_by_id(self, params: JobClaimByIDParams) -> JobLeaseRow:
        """Claim a waiting job (available, scheduled or retryable, whatever its
        schedule) by ID under a job lease with a token the database generates.

        The job runs with no owning client, attempt and fence incremented. The
        queue's pause, the TTL and the ordering key apply; queue limits do not.
        Raises, first that applies: NotFound (neither live nor history),
        JobNotClaimable (in history), JobFenced (live at another fence),
        JobRunning (running at ``fence``), JobNotClaimable (pending, past its
        TTL, queue paused, or not its ordering key's head). Waits for the row
        if another transaction holds it.
        """

    @abstractmethod
    def job_lease_renew(self, params: JobLeaseRenewParams) -> JobLeaseStatus:
        """Extend a job lease by its TTL from database now; report a cancel request.

        Raises JobFenced once the lease is no longer the job's. Succeeds until
        an expiry is applied, not only until ``expires_at``.
        """

    @abstractmethod
    def job_expire_leases(self, params: JobExpireLeasesParams) -> list[JobRow]:
        """End the attempts of up to ``limit`` jobs whose leases are due.

        Due: at the lease's expiry, or, if a client with a live lease started
        after the lease was last renewed (no later than the lease's expiry plus
        ``grace``, and no later than now), at the first such start plus the
        larger of the lease's TTL and ``grace``, if later. All by database
        time: a start past the expiry plus the grace is no sign the holder
        could not renew, so clients that keep starting (each cron run of
        ``hopper_maintain --once``) never hold a dead lease up.
        Each ends as :func:`lease_expiry_result` says. Expires nothing unless
        ``client_id``'s own lease is live. Returns the jobs as they are afterwards.
        """

    @abstractmethod
    def job_step_get(self, params: JobStepGetParams) -> JobStepRow | None:
        """Return a step's ledger row (None if never tried), as the claim that owns the job.

        A step boundary: renews the job's lease in the same transaction when
        the claim is a lease. Raises JobFenced if the claim no longer owns the job.
        """

    @abstractmethod
    def job_step_record(self, params: JobStepRecordParams) -> JobStepRow:
        """Record one try of a step, conditional on the claim still owning the job.

        Attempts grow by one; ``done`` stores the result (kept thereafter), an
        error is kept as ``last_error``. Renews the lease in the same
        transaction when the claim is a lease. Raises JobFenced, writing
        nothing, if the claim lost the job.
        """

    @abstractmethod
    def job_steps_clear(self, params: JobStepsClearParams) -> int:
        """Drop a job's step ledger as the claim that owns it; return the rows dropped.

        Raises JobFenced, dropping nothing, if the claim lost the job (a stale
        pass must not empty the ledger of the pass that took the job over).
        """

    @abstractmethod
    def job_steps(self, id: JobID) -> list[JobStepRow]:
        """Return a job's step ledger in the order the steps were first tried (no fence)."""


class PubSubContract(ABC):
    """Subscriptions and publishing: every engine implements each of these."""

    @abstractmethod
    def subscription_upsert(
        self, rows: Sequence[SubscriptionRow], now: dt.datetime | None = None
    ) -> None:
        """Record subscriptions, updating pattern, kind, queue and settings by name."""

    @abstractmethod
    def subscription_list(self) -> list[SubscriptionRow]:
        """Return every subscription, by name."""

    @abstractmethod
    def message_publish(self, params: MessagePublishParams) -> list[JobInsertResult]:
        """Insert one delivery per subscription whose pattern matches the topic, in
        one insert statement of the caller's transaction; return them in
        subscription-name order. A delivery whose dedup key matches a live one is
        returned as a duplicate."""


class StreamsContract(ABC):
    """The stream log and its consumers: every engine implements each of these."""

    @abstractmethod
    def stream_append(self, params: StreamAppendParams) -> StreamEvent:
        """Append one event and return it with its position."""

    @abstractmethod
    def stream_read(self, params: StreamReadParams) -> list[StreamEvent]:
        """Page through committed events after a position whose topic matches, in
        position order. For browsing: a consumer is what never misses a late commit."""

    @abstractmethod
    def stream_consumer_upsert(
        self, rows: Sequence[StreamConsumerRow], now: dt.datetime | None = None
    ) -> None:
        """Record consumers, updating pattern, kind, queue and settings by name; a
        new consumer starts at its ``start``; an existing one keeps its position."""

    @abstractmethod
    def stream_consumer_list(self) -> list[StreamConsumerRow]:
        """Return every consumer with its position, by name."""

    @abstractmethod
    def stream_consumer_seek(self, name: str, params: StreamSeekParams) -> StreamConsumerRow:
        """Move a consumer: events after the new position are delivered (again).
        Raises NotFound for an unknown consumer."""

    @abstractmethod
    def stream_pump(
        self, name: str, limit: int, now: dt.datetime | None = None
    ) -> StreamPumpResult:
        """Turn up to ``limit`` events after a consumer's position into delivery jobs
        and advance the position, atomically; two pumps of one consumer serialize on
        its row. Never skips an event whose transaction commits late. Raises NotFound
        for an unknown consumer."""

    @abstractmethod
    def stream_prune(self, params: StreamPruneParams) -> int:
        """Delete up to ``limit`` events older than the retention; return how many."""
