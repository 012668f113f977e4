"""The engine's params and results: one frozen dataclass per method's input.

Three are not frozen: :class:`JobFinalize` and :class:`JobFinalized`, built
once per job by the worker and the engines, and :class:`JobInsertParams`,
built once per enqueued job. A frozen dataclass's ``__init__`` sets each field
through ``object.__setattr__``: about 22,000 machine instructions for a
result against 6,800 with plain slot stores (callgrind, CPython 3.11), and
half of ``enqueue()``'s own Python before its statement. Nothing assigns to
them once built (a new value is a ``dataclasses.replace`` copy).

Internal: the layers above the engine build these, and the engine's shared
front validates them (:mod:`django_hopper.engine.base`). What users receive
lives in :mod:`django_hopper.types`; a change here changes no public type.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_hopper.types import (
    JSON,
    AttemptError,
    ConflictAction,
    DependencyFailure,
    JobID,
    JobRow,
    JobState,
    LeaseFence,
    QueueLimits,
    StreamConsumerRow,
    StreamPosition,
    SubscriptionRow,
)

# ---------------------------------------------------------------------------
# Jobs


class JobInsertResult:
    """One input's result: the job as stored, and whether it was a duplicate.

    ``job`` is the row, or is built on its first read from what the engine
    kept of the insert (``build``, a call without arguments over values that
    never change): the one-job insert of ``enqueue()`` knows every field of
    the row it wrote, and a caller that keeps only the ID never pays for the
    row (about a sixth of ``enqueue()``'s own Python). Either way ``job``
    reads the same row.
    """

    __slots__ = ("_build", "_job", "duplicate")

    def __init__(
        self,
        job: JobRow | None = None,
        duplicate: bool = False,
        *,
        build: Callable[[], JobRow] | None = None,
    ) -> None:
        if (job is None) == (build is None):
            raise TypeError("JobInsertResult takes a job or a build, not both or neither")
        self._job = job
        self._build = build
        #: True when a job with the same unique key already existed; ``job`` is
        #: then that existing job.
        self.duplicate = duplicate

    @property
    def job(self) -> JobRow:
        job = self._job
        if job is None:
            assert self._build is not None
            job = self._job = self._build()
            self._build = None
        return job

    def __eq__(self, other: object) -> bool:
        if type(other) is not JobInsertResult:
            return NotImplemented
        return (self.job, self.duplicate) == (other.job, other.duplicate)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        return f"JobInsertResult(job={self.job!r}, duplicate={self.duplicate!r})"


@dataclass(slots=True)
class JobClaimResult:
    jobs: list[JobRow]
    #: When positive, how long the rate limit will allow nothing.
    wait: dt.timedelta = dt.timedelta(0)
    #: The jobs of ``jobs`` claimed ahead of a free slot (``JobClaimParams.ahead``).
    ahead: frozenset[JobID] = frozenset()


@dataclass(slots=True)  # not frozen: one per applied result (module docstring)
class JobFinalized:
    id: JobID
    fence: int


@dataclass(slots=True)
class RescueCandidate:
    job: JobRow
    #: True when selected for running longer than StuckAfter rather than for
    #: its client's expired lease.
    stuck: bool
    #: Claimed ahead of a free slot: nothing tells whether it started, so its
    #: rescue is an admission miss, never a charged attempt.
    ahead: bool = False


@dataclass(slots=True)
class ClientRenewResult:
    #: False if the lease had already expired: the client is fenced.
    renewed: bool
    #: The client's running jobs that have a pending cancel request.
    cancel_requested: list[JobID] = field(default_factory=list)
    paused_queues: list[str] = field(default_factory=list)
    #: Queues with a global, rate or partition limit (claimed through the
    #: limited path).
    limited_queues: list[str] = field(default_factory=list)


@dataclass(slots=True)  # not frozen: one per enqueued job (module docstring)
class JobInsertParams:
    kind: str
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 25
    #: None to run as soon as possible.
    scheduled_at: dt.datetime | None = None
    args: JSON = field(default_factory=dict)
    metadata: JSON = field(default_factory=dict)
    #: Distinct, not empty.
    tags: tuple[str, ...] = ()
    #: None for non-unique jobs.
    unique_key: str | None = None
    #: Finished states in which a job in history with the same kind and unique
    #: key is a duplicate too.
    unique_finished: tuple[str, ...] = ()
    #: Serializes the job with others of the same key in its queue.
    ordering_key: str | None = None
    partition_key: str | None = None
    batch_id: JobID | None = None
    #: If set, expires_at = database now + ttl.
    ttl: dt.timedelta | None = None
    #: Announce the finalize on CHANNEL_DONE.
    awaited: bool = False
    #: Pre-generated ID (UUIDv7); the engine generates one when None.
    id: JobID | None = None
    #: The data subject whose data the job carries: ``subject_erase`` finds it by this.
    subject: str | None = None


@dataclass(slots=True, frozen=True)
class JobInsertOpts:
    #: Wake workers on the inserted queues once the insert commits.
    notify: bool = False
    on_conflict: str = ConflictAction.SKIP
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobClaimParams:
    queue: str
    client_id: int
    #: How many jobs to claim into free slots (they start at once).
    limit: int
    #: Lock the queue row and apply its limits.
    limited: bool = False
    now: dt.datetime | None = None
    #: How many more unkeyed jobs to claim ahead of a free slot, marked so that a
    #: rescue counts each as an admission miss; ignored on the limited path.
    ahead: int = 0


@dataclass(slots=True, frozen=True)
class JobReturnManyParams:
    """Give back jobs claimed ahead of a free slot that never started."""

    #: The client whose claim holds the jobs.
    client_id: int
    #: (job ID, fence of the claim) of each job.
    jobs: Sequence[tuple[JobID, int]]
    now: dt.datetime | None = None


@dataclass(slots=True)  # not frozen: one per attempt (module docstring)
class JobFinalize:
    """One result of one attempt."""

    id: JobID
    #: The claim of the attempt: the client and the fence.
    attempted_by: int | None
    fence: int
    #: completed, canceled, discarded (to history) or retryable, scheduled (stays live).
    state: str
    #: How long from database now the job waits; only retryable and scheduled.
    delay: dt.timedelta = dt.timedelta(0)
    #: Give the attempt back: the retry does not count against max_attempts.
    snooze: bool = False
    snooze_reason: str | None = None
    #: Appended to the job's errors; ``at`` is set by the engine from database time.
    error: AttemptError | None = None
    output: JSON = None
    #: Appended to the job's logs, with ``snoozed`` set from ``snooze``.
    log: str | None = None
    #: Write a completed job to history; canceled and discarded always are.
    archive: bool = True
    #: When set, the result is fenced to this job lease instead of a client.
    lease_token: JobID | None = None


@dataclass(slots=True, frozen=True)
class JobFinalizeParams:
    jobs: Sequence[JobFinalize]
    #: None of the jobs belongs to a batch or workflow: skip that bookkeeping.
    no_batches: bool = False
    #: Skip jobs whose rows another transaction holds instead of waiting.
    skip_locked: bool = False
    #: The most attempt logs a job keeps (the latest). 0 keeps them all.
    keep_logs: int = 0
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobRecordProgressParams:
    id: JobID
    attempted_by: int | None
    fence: int
    attempt: int
    step: str = ""
    keep_step: bool = False
    cursor: JSON = None
    no_wait: bool = False
    lease_token: JobID | None = None
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobListParams:
    queue: str | None = None
    kinds: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    #: Needs ``queue``: a key is a lane only within its queue.
    ordering_key: str | None = None
    newest_first: bool = False
    #: The cursor: only jobs after it in the listing's order.
    after: JobID | None = None
    limit: int = 100
    ids: tuple[JobID, ...] = ()
    priorities: tuple[int, ...] = ()
    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    #: A JSON object; jobs whose metadata contains it (Postgres ``@>`` semantics).
    metadata: dict[str, Any] | None = None


@dataclass(slots=True, frozen=True)
class JobCancelParams:
    id: JobID
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobRetryParams:
    id: JobID
    #: Clear the job's progress, so that it runs all its steps again.
    from_start: bool = False
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobDeleteParams:
    id: JobID
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobCancelManyParams:
    """Cancel many jobs in one statement: each as ``job_cancel`` would."""

    ids: Sequence[JobID]
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobRetryManyParams:
    """Retry many jobs in one statement: each as ``job_retry`` would."""

    ids: Sequence[JobID]
    #: Clear each job's progress, so that it runs all its steps again.
    from_start: bool = False
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobDeleteManyParams:
    """Delete many jobs in one statement: each as ``job_delete`` would."""

    ids: Sequence[JobID]
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobDiscardExpiredParams:
    limit: int = 1000
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobRescueParams:
    #: If positive, also running jobs claimed longer ago than this.
    stuck_after: dt.timedelta = dt.timedelta(0)
    limit: int = 1000
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobScheduleParams:
    """Promote due scheduled and retryable jobs to available."""

    queue: str | None = None
    limit: int = 10_000
    now: dt.datetime | None = None


# ---------------------------------------------------------------------------
# Clients and the leader


@dataclass(slots=True, frozen=True)
class ClientRegisterParams:
    hostname: str
    ttl: dt.timedelta
    info: JSON = field(default_factory=dict)
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class ClientRenewParams:
    client_id: int
    ttl: dt.timedelta
    #: Jobs the client completed without archiving them in the last minute, per
    #: queue (history does not count them); None leaves the last report in place.
    completed: Mapping[str, int] | None = None
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class LeaderParams:
    client_id: int
    ttl: dt.timedelta
    now: dt.datetime | None = None


# ---------------------------------------------------------------------------
# Periodic jobs, history and upkeep


@dataclass(slots=True, frozen=True)
class PeriodicInsertParams:
    #: The periodic job's name, the key of its slot row.
    name: str
    #: The slot the job is for; inserted only if later than the recorded last slot.
    slot: dt.datetime
    job: JobInsertParams
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class PeriodicDisableParams:
    """Stop a periodic job's slots from being inserted until it is enabled."""

    name: str
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class PeriodicEnableParams:
    """Let a disabled periodic job's slots be inserted again, from its next slot on."""

    name: str
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class PeriodicRunNowParams:
    """Run a periodic job now, without double-firing a slot the leader inserts.

    With ``slot``, the run is that (due) slot's job, inserted only if the slot
    was not already: the leader's tick and the run now then make one job. With
    ``slot`` None, ``job`` is an extra run outside the schedule, which should
    carry a unique key so that a second click while it waits returns it.
    """

    name: str
    #: The slot's job (used with ``slot``).
    job: JobInsertParams
    #: The extra run, outside the schedule (without ``slot``, or when the slot
    #: cannot be the run).
    extra: JobInsertParams
    slot: dt.datetime | None = None
    now: dt.datetime | None = None


@dataclass(slots=True)
class PeriodicRunNowResult:
    #: The run: inserted now, or the one a slot or an earlier run now inserted.
    job: JobRow
    #: The slot the run is for, or None for an extra run outside the schedule.
    slot: dt.datetime | None = None
    #: False when ``job`` already existed (the leader inserted the slot, or an
    #: earlier run now still waits).
    inserted: bool = True


@dataclass(slots=True, frozen=True)
class PeriodicRegistration:
    """A periodic job as one client declares it."""

    name: str
    #: The definition as JSON (django_hopper.periodic.PeriodicDefinition.to_json()).
    definition: JSON
    #: sha256 of the definition's canonical JSON.
    digest: str


@dataclass(slots=True, frozen=True)
class PeriodicRegisterParams:
    client_id: int
    registrations: Sequence[PeriodicRegistration]
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class HistoryMaintainParams:
    #: How long completed jobs are kept.
    completed_retention: dt.timedelta
    #: How long canceled and discarded jobs are kept.
    failed_retention: dt.timedelta
    #: How long creating or dropping a storage unit waits for its lock; what
    #: cannot lock in time is deferred. Zero means the engine's default (100 ms).
    lock_timeout: dt.timedelta = dt.timedelta(0)
    #: Partitions (days) prepared ahead of today, today included as day 0.
    create_ahead: int = 3
    #: Create missing partitions / drop expired ones (``hopper_partitions`` picks).
    create: bool = True
    drop: bool = True
    #: Delete expired rows individually (outside partition drops).
    prune: bool = True
    #: Rows deleted individually per statement, and at most this many statements a pass.
    chunk_size: int = 5_000
    max_chunks: int = 20
    #: A partition past the shorter retention only is dropped if at most this
    #: many of its rows are still within their own (longer) retention: those
    #: move to the DEFAULT partition. Otherwise it is kept until the longer one.
    move_limit: int = 10_000
    #: Report what would change and change nothing (``pruned`` then counts the
    #: rows a pass would delete, up to chunk_size * max_chunks).
    dry_run: bool = False
    now: dt.datetime | None = None


@dataclass(slots=True)
class HistoryMaintainResult:
    #: Storage units (partitions on PostgreSQL) created and dropped.
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    #: Units whose creation or drop could not get its lock within lock_timeout;
    #: a later pass retries them.
    deferred: list[str] = field(default_factory=list)
    #: Units past the shorter retention kept because too many of their rows are
    #: still within the longer one; their expired rows are pruned instead.
    kept: list[str] = field(default_factory=list)
    #: Jobs deleted individually, outside partition drops.
    pruned: int = 0
    #: What the jobs gone from live and history leave behind, deleted in
    #: bounded chunks after the prune: completed batches none of whose jobs
    #: or callbacks remain live or in history (callbacks: live), workflow
    #: edges whose dependent is gone, and step-ledger rows whose job is gone.
    batches_deleted: int = 0
    edges_deleted: int = 0
    steps_deleted: int = 0


@dataclass(slots=True, frozen=True)
class HistoryIndexParams:
    #: Storage units (partitions) to leave for a later pass.
    skip: tuple[str, ...] = ()
    #: How long attaching a built index waits for its lock; zero: 100 ms.
    lock_timeout: dt.timedelta = dt.timedelta(0)
    #: Bounds each build (``statement_timeout``); zero keeps the session's.
    statement_timeout: dt.timedelta = dt.timedelta(0)
    #: Invalid indexes (by name) not to try to repair this pass; they stay in
    #: the result's ``invalid``. A caller passes those whose repair failed
    #: before, so that an index that cannot be rebuilt (duplicates under a
    #: unique index) is not rebuilt in vain on every pass.
    skip_repair: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class HistoryIndexDeclareParams:
    """Declare an index on partitioned history's parent only, or drop one."""

    #: The parent index's name.
    name: str
    #: The definition's tail after ``ON <table>``: ``USING gin (tags) WHERE ...``.
    definition: str = ""
    #: Drop the index (and every partition's copy of it) instead.
    drop: bool = False


@dataclass(slots=True)
class HistoryIndexResult:
    #: Indexes built and attached this pass ("<partition>.<index>").
    built: list[str] = field(default_factory=list)
    #: Invalid indexes of hopper's tables rebuilt this pass (an interrupted
    #: concurrent build's leftover), now valid.
    repaired: list[str] = field(default_factory=list)
    #: Transient copies an interrupted concurrent rebuild left (``*_ccnew``,
    #: ``*_ccold``), and partitions' copies of a parent index that is gone
    #: (valid or not), dropped this pass.
    removed: list[str] = field(default_factory=list)
    #: Partitions whose build ran past the statement timeout (what it left is removed).
    timed_out: list[str] = field(default_factory=list)
    #: Indexes still invalid after the pass: parent indexes although every
    #: partition is indexed, indexes named in ``skip_repair``, and those whose
    #: repair failed (the pass then raises ``HistoryIndexRepairError``). Queries
    #: that need one read without it.
    invalid: list[str] = field(default_factory=list)
    #: Builds, attaches or repairs that could not lock in time (held off by a
    #: transaction on the table, or a build under way); a later pass retries them.
    deferred: list[str] = field(default_factory=list)
    #: Set when another session holds the build lock: the index this pass would
    #: have built next. Nothing waited.
    busy: str = ""
    #: Indexes whose repair failed this pass, with the error: the engine's
    #: front raises ``HistoryIndexRepairError`` for them once the pass is done.
    repair_errors: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class SchemaState:
    """Which hopper schema a database has, read without waiting for a migration."""

    #: The number of the newest applied hopper migration; 0 without the schema.
    version: int = 0
    #: The oldest code version (its newest migration's number) the schema
    #: still serves: the largest any applied migration declared, or 0.
    oldest_code: int = 0


@dataclass(slots=True, frozen=True)
class SchemaLockParams:
    #: Seconds between two tries while another process holds the lock. The
    #: lock is polled, never waited for inside the database: a statement
    #: waiting there would hold a snapshot, and the holder's concurrent index
    #: builds wait for every older snapshot to end, a wait neither side sees.
    poll_interval: float = 0.5
    #: Called once, with a description of the holder, if the lock is held.
    on_wait: Callable[[str], None] | None = None


@dataclass(slots=True, frozen=True)
class JobsMaintainParams:
    #: VACUUM a hot table once it has this many dead tuples.
    vacuum_dead_tuples: int = 100_000
    #: ANALYZE once this many rows changed since the last analyze ...
    analyze_changes: int = 100_000
    #: ... or when the planner's row estimate is off by this factor ...
    analyze_ratio: float = 10.0
    #: ... for a table that holds at least this many rows now (a smaller one keeps
    #: the statistics it has: those of a nearly empty table plan scans).
    analyze_min_rows: int = 1_000


@dataclass(slots=True)
class JobsMaintainResult:
    #: Whether the live job table was vacuumed / analyzed.
    vacuumed: bool = False
    analyzed: bool = False
    #: What was done per hot table: "vacuumed", "analyzed" or "failed: <error>".
    tables: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Batches and workflows


@dataclass(slots=True, frozen=True)
class SubjectEraseParams:
    """Erase every job row that carries ``subject``, live and in history."""

    subject: str
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class BatchInsertParams:
    """A batch expecting ``total`` jobs, inserted separately with their batch_id set."""

    total: int
    #: Inserted when the batch completes: on_success if no job was canceled or
    #: discarded, on_failure otherwise, on_complete either way. Each callback's
    #: metadata gains ``batch_id``.
    on_success: JobInsertParams | None = None
    on_failure: JobInsertParams | None = None
    on_complete: JobInsertParams | None = None
    metadata: JSON = field(default_factory=dict)
    #: Pre-generated ID (UUIDv7); the engine generates one when None.
    id: JobID | None = None
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class BatchSettleParams:
    #: The batches to settle, waiting briefly for a row another transaction
    #: holds. An empty (non-None) tuple settles nothing.
    ids: tuple[JobID, ...] | None = None
    #: With ids None: up to ``limit`` open batches with progress, ID after ``after``.
    after: JobID | None = None
    limit: int = 1000
    #: With ids None: also delete up to ``limit`` dependency results of
    #: workflows that completed or no longer exist.
    results: bool = False
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class BatchDuplicatesParams:
    """Inputs of batches that ``job_insert_many`` found duplicated by an existing job."""

    #: (the input's batch ID, the ID of the job that holds its unique key), one
    #: pair per duplicate input.
    duplicates: tuple[tuple[JobID, JobID], ...]


@dataclass(slots=True)
class BatchDuplicatesResult:
    #: Live jobs of no batch that joined the input's batch (their end counts then).
    joined: int = 0
    #: Inputs counted toward their batch's progress now.
    counted: int = 0
    #: The batches with progress counted now: settle them.
    batches: tuple[JobID, ...] = ()


@dataclass(slots=True)
class BatchSettleResult:
    #: Batches whose progress was folded, and those of them that completed.
    folded: int = 0
    completed: int = 0
    #: The greatest ID folded: the ``after`` of a sweep's next chunk.
    last: JobID | None = None


@dataclass(slots=True, frozen=True)
class JobDependency:
    """An edge of a workflow: ``jobs[job]`` waits for ``jobs[depends_on]`` (indexes)."""

    job: int
    depends_on: int
    on_failure: str = DependencyFailure.CANCEL
    #: Claim ``job`` with ``depends_on``'s final state and output in its dependencies.
    reads: bool = False


@dataclass(slots=True, frozen=True)
class WorkflowInsertParams:
    name: str
    #: No unique keys (a skipped job would leave its dependents waiting forever)
    #: and no batch_id (the workflow is their batch).
    jobs: Sequence[JobInsertParams]
    #: Empty, or one name per job ("" for an unnamed one); names are unique.
    steps: Sequence[str] = ()
    deps: Sequence[JobDependency] = ()
    on_success: JobInsertParams | None = None
    on_failure: JobInsertParams | None = None
    on_complete: JobInsertParams | None = None
    metadata: JSON = field(default_factory=dict)
    #: Wake workers on the queues of jobs that start available (at commit).
    notify: bool = False
    id: JobID | None = None
    now: dt.datetime | None = None


@dataclass(slots=True)
class WorkflowInsertResult:
    id: JobID
    #: In input order.
    jobs: list[JobInsertResult]


@dataclass(slots=True, frozen=True)
class WorkflowPromoteParams:
    #: Finalized jobs whose pending dependents to promote (or fail). An empty
    #: (non-None) tuple promotes nothing.
    depends_on: tuple[JobID, ...] | None = None
    #: With depends_on None: up to ``limit`` pending workflow jobs, ID after ``after``.
    after: JobID | None = None
    limit: int = 1000
    now: dt.datetime | None = None


@dataclass(slots=True)
class WorkflowPromoteResult:
    #: Jobs made claimable.
    promoted: int = 0
    #: Pending jobs canceled or discarded because a dependency failed.
    failed: int = 0
    #: Jobs considered by a sweep, and the greatest of their IDs.
    scanned: int = 0
    last: JobID | None = None
    #: The batches of the jobs that failed, to settle.
    batches: list[JobID] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Queues


@dataclass(slots=True, frozen=True)
class JobRetryOrderingKeyParams:
    queue: str
    ordering_key: str
    #: At most this many waiting (scheduled or retryable) jobs become available.
    limit: int = 1000
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobAgeParams:
    queue: str
    #: Jobs claimable for longer than this gain one priority level.
    after: dt.timedelta
    now: dt.datetime | None = None


@dataclass(slots=True)
class QueueState:
    """The queue row as the limited claim locked it, with the queue's running counts."""

    limits: QueueLimits
    paused: bool
    #: The token bucket: tokens left at ``rate_refilled_at`` (None: never used, full).
    rate_tokens: float | None
    rate_refilled_at: dt.datetime | None
    #: Running jobs of the queue across all clients.
    running: int
    #: The clock of the claim's transaction.
    now: dt.datetime


# ---------------------------------------------------------------------------
# Job leases and the step ledger


@dataclass(slots=True, frozen=True)
class JobClaimByIDParams:
    id: JobID
    #: The fence the job must have (0 for a job never claimed); another raises JobFenced.
    fence: int
    #: The lease's time to live from each claim or renewal (at least a microsecond).
    ttl: dt.timedelta
    now: dt.datetime | None = None
    #: Raise JobLocked at once, instead of waiting, if another transaction holds
    #: the job's row (on a single-writer engine: if another transaction writes).
    no_wait: bool = False


@dataclass(slots=True)
class JobLeaseRow:
    #: The job as claimed: running with no owning client, attempt and fence incremented.
    job: JobRow
    lease: LeaseFence
    expires_at: dt.datetime


@dataclass(slots=True, frozen=True)
class JobLeaseRenewParams:
    id: JobID
    lease: LeaseFence
    now: dt.datetime | None = None


@dataclass(slots=True)
class JobLeaseStatus:
    #: The lease's new expiry, by database time.
    expires_at: dt.datetime
    #: job_cancel was called on the job.
    cancel_requested: bool


@dataclass(slots=True, frozen=True)
class JobExpireLeasesParams:
    limit: int
    #: The expiring client (the leader), whose own lease must be live.
    client_id: int
    #: The least time a lease is given past a client's start.
    grace: dt.timedelta = dt.timedelta(0)
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobStepGetParams:
    """Read one step at a step boundary, as the attempt that claimed the job."""

    id: JobID
    step: str
    #: The claim: client and fence, or lease_token and fence for a job claimed by ID.
    attempted_by: int | None
    fence: int
    lease_token: JobID | None = None
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobStepRecordParams:
    """Record one try of a step: its result when ``done``, its error otherwise."""

    id: JobID
    step: str
    attempted_by: int | None
    fence: int
    done: bool
    result: JSON = None
    error: str | None = None
    lease_token: JobID | None = None
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class JobStepsClearParams:
    """Drop the ledger of a job's pass (the commit of a pass drops it with the cursor)."""

    id: JobID
    attempted_by: int | None
    fence: int
    lease_token: JobID | None = None
    #: Also set the running job's attempt to 1, so that the snooze which ends a
    #: committed pass gives it back to 0: attempts then count consecutive failed
    #: passes (a committed pass clears the attempts).
    reset_attempt: bool = False
    now: dt.datetime | None = None


# ---------------------------------------------------------------------------
# Pub/sub and streams


@dataclass(slots=True, frozen=True)
class MessagePublishParams:
    topic: str
    payload: JSON = None
    #: Stored in each delivery's metadata (``metadata["headers"]``) and message.
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Serializes deliveries with the same key per queue.
    ordering_key: str | None = None
    #: Makes the publish idempotent while an earlier delivery is live: each
    #: delivery's unique key is ``<subscription>:<dedup_key>``.
    dedup_key: str | None = None
    #: Schedules the deliveries this long after database now.
    delay: dt.timedelta | None = None
    #: Sets each delivery's expires_at, as JobInsertParams.ttl does.
    ttl: dt.timedelta | None = None
    priority: int = 0
    awaited: bool = False
    #: Wake workers on the delivery queues once the publish commits.
    notify: bool = False
    #: Pre-generated message ID; the engine generates one (UUIDv7 hex) when None.
    message_id: str | None = None
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class SubscriptionPauseParams:
    """Hold a subscription's deliveries: publishes still make them, held until resumed."""

    name: str
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class SubscriptionResumeParams:
    """Deliver again, and release the deliveries held while paused."""

    name: str
    now: dt.datetime | None = None


@dataclass(slots=True)
class SubscriptionResumeResult:
    subscription: SubscriptionRow
    #: Held deliveries released (due now).
    released: int = 0
    #: The queues the released deliveries are in.
    queues: list[str] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class SubscriptionDeleteParams:
    """Delete a subscription: later publishes make no delivery for it.

    Its deliveries already made still run (held ones are released), unless
    ``cancel_pending``: then every one not running is canceled, in the same
    transaction. Running deliveries always finish.
    """

    name: str
    cancel_pending: bool = False
    now: dt.datetime | None = None


@dataclass(slots=True)
class RouteDeleteResult:
    """What deleting a subscription or a stream consumer did to its deliveries."""

    #: The deleted subscription or consumer, as it was.
    route: SubscriptionRow | StreamConsumerRow
    #: Waiting deliveries canceled (``cancel_pending``).
    canceled: int = 0
    #: Held deliveries released to run (a paused subscription, without ``cancel_pending``).
    released: int = 0
    #: The queues of the released deliveries.
    queues: list[str] = field(default_factory=list)
    #: The deliveries canceled, as they are now (for ``jobs_ended``).
    ended: list[JobRow] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class StreamConsumerPauseParams:
    """Stop pumping a consumer: its events wait in the log at its position."""

    name: str
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class StreamConsumerResumeParams:
    name: str
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class StreamConsumerResetParams:
    """Move a consumer back to its ``start``, as if it were created now."""

    name: str
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class StreamConsumerDeleteParams:
    """Delete a consumer and its position; ``cancel_pending`` as for subscriptions."""

    name: str
    cancel_pending: bool = False
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class StatsBoundedParams:
    """Read queue depths at a cost bounded by ``limit``, whatever the live jobs."""

    #: Count each queue's jobs in a state up to this many (beyond: ``capped``).
    limit: int = 1000
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class StreamConsumerLagParams:
    #: The consumers to measure; empty: every consumer.
    names: tuple[str, ...] = ()
    #: Read at most this many waiting events per consumer (beyond: ``capped``).
    limit: int = 1000


@dataclass(slots=True, frozen=True)
class StreamAppendParams:
    topic: str
    payload: JSON = None
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Signal CHANNEL_STREAM (delivered at commit).
    notify: bool = False
    #: Pre-generated message ID; the engine generates one (UUIDv7 hex) when None.
    message_id: str | None = None
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class StreamReadParams:
    #: An AMQP topic pattern; empty matches every topic.
    pattern: str = ""
    after: StreamPosition = StreamPosition()
    limit: int = 100


@dataclass(slots=True, frozen=True)
class StreamSeekParams:
    """Exactly one of the four: where the consumer reads from next."""

    #: The next event delivered is the one after it.
    position: StreamPosition | None = None
    #: Just before the first event appended at or after this time.
    time: dt.datetime | None = None
    #: Before every retained event.
    earliest: bool = False
    #: Past every event appended so far.
    latest: bool = False


@dataclass(slots=True)
class StreamPumpResult:
    delivered: int = 0
    #: The consumer's position afterwards.
    position: StreamPosition = StreamPosition()
    #: Queues that received deliveries.
    queues: list[str] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class StreamPruneParams:
    #: Events created longer ago than this (by database time) are deleted.
    retention: dt.timedelta
    #: At most this many per call.
    limit: int = 5_000
    now: dt.datetime | None = None


# ---------------------------------------------------------------------------
# Pass leases of resumable runs: BEGIN, admission misses, takeover


@dataclass(slots=True, frozen=True)
class JobPassBeginParams:
    """BEGIN a claimed pass: the commitment point after which its handler runs.

    The claim is a client's (``attempted_by`` + ``fence``) or a job lease's
    (``lease_token`` + ``fence``). A client's claim is taken to have leased the
    job for ``ttl`` from the claim (``attempted_at``).
    """

    id: JobID
    attempted_by: int | None
    fence: int
    #: The pass lease's time to live, from BEGIN and from each step boundary.
    ttl: dt.timedelta
    #: BEGIN holds only while the lease runs more than this past database now.
    margin: dt.timedelta
    lease_token: JobID | None = None
    now: dt.datetime | None = None


@dataclass(slots=True)
class JobPassBegun:
    #: The pass lease that owns the job from BEGIN on: every later write is fenced to it.
    lease: LeaseFence
    expires_at: dt.datetime


@dataclass(slots=True, frozen=True)
class JobPassMissParams:
    """Record an admission miss: a claim that did not BEGIN its pass.

    Fenced to the claim, and only while it has not begun. The attempt is given
    back (no handler ran); at ``max_misses`` consecutive misses the run is
    discarded with ``reason``.
    """

    id: JobID
    attempted_by: int | None
    fence: int
    #: Consecutive misses at which the run fails instead of waiting again.
    max_misses: int
    #: Why the claim did not begin (kept in the snooze reason, or the final error).
    reason: str
    lease_token: JobID | None = None
    now: dt.datetime | None = None
    #: The claim was made ahead of a free slot (rules.admission_miss_result's words).
    ahead: bool = False


@dataclass(slots=True)
class JobPassMissed:
    #: Consecutive admission misses of the run, this one included.
    misses: int
    #: The run was discarded (``misses`` reached the bound) or canceled.
    failed: bool


@dataclass(slots=True, frozen=True)
class JobPassGetManyParams:
    """Read the pass state of many live runs in one statement."""

    ids: Sequence[JobID]


@dataclass(slots=True, frozen=True)
class JobPassTakeoverParams:
    """Take over the pass leases of ``kinds`` that expired by database time, or
    whose holding worker's client lease did.

    A pass that had begun is charged as a failed attempt (its holder stopped
    reporting); a claim that never began is an admission miss, not charged.
    """

    #: The resumable job kinds whose leases that never began are pass leases too
    #: (a begun pass lease is taken over whatever its kind).
    kinds: tuple[str, ...]
    limit: int
    #: Consecutive admission misses at which a never-begun run fails.
    max_misses: int
    #: Only this queue's runs, or every queue.
    queue: str | None = None
    now: dt.datetime | None = None


@dataclass(slots=True)
class JobPassTaken:
    id: JobID
    #: The state the takeover left the run in: waiting again, or finished.
    state: JobState
    #: The expired pass had begun, and was charged an attempt.
    began: bool
    #: The run's consecutive admission misses after the takeover.
    misses: int


@dataclass(slots=True)
class JobPassRow:
    """What a live run's row says of its current pass lease and admission misses."""

    id: JobID
    #: When the holding pass BEGAN; None before BEGIN (or with no pass running).
    began_at: dt.datetime | None
    #: Consecutive claims that did not begin their pass; 0 once one does.
    admission_misses: int
    lease_expires_at: dt.datetime | None
