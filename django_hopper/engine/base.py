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
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

JobID = uuid.UUID
JSON = Any  # a value that json.dumps accepts


# ---------------------------------------------------------------------------
# Constants


class ConflictAction:
    """What an insert does with an input whose unique key matches a live job."""

    #: Return the existing job as a duplicate.
    SKIP = "skip"
    #: Replace the existing job's args, metadata, priority, max attempts and
    #: schedule unless it is running; it is still returned as a duplicate.
    REPLACE = "replace"


class RescueReason:
    """Why hopper, not the attempt, ended an attempt (``AttemptError.rescue``)."""

    CLIENT_EXPIRED = "client_expired"
    STUCK = "stuck"
    LEASE_EXPIRED = "lease_expired"
    TTL_EXPIRED = "ttl_expired"
    CANCELED = "canceled"
    DEPENDENCY_FAILED = "dependency_failed"


#: Notification channels (LISTEN/NOTIFY on Postgres).
CHANNEL_INSERT = "hopper_insert"
CHANNEL_CONTROL = "hopper_control"
CHANNEL_DONE = "hopper_done"
CHANNEL_STREAM = "hopper_stream"
CHANNEL_LEADER = "hopper_leader"


# ---------------------------------------------------------------------------
# Rows


@dataclass(slots=True)
class AttemptError:
    """One failure of a job, recorded with database time."""

    at: dt.datetime | None
    attempt: int
    error: str
    #: The fence of the failed claim; 0 for entries hopper records itself for
    #: a job that is not running (a cancel, an expiry, a failed dependency).
    fence: int = 0
    trace: str = ""
    #: Set when hopper, not the attempt, ended it (see RescueReason).
    rescue: str = ""
    #: The client whose attempt failed (the claim's ``attempted_by``); None when
    #: no claimed attempt ran (a cancel or expiry of a waiting job, a job lease).
    by: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object stored in the job's ``errors`` list."""
        out: dict[str, Any] = {
            "at": self.at.isoformat() if self.at else None,
            "attempt": self.attempt,
            "error": self.error,
        }
        if self.fence:
            out["fence"] = self.fence
        if self.trace:
            out["trace"] = self.trace
        if self.rescue:
            out["rescue"] = self.rescue
        if self.by is not None:
            out["by"] = self.by
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AttemptError:
        """Parse one stored entry; tolerate entries of earlier releases."""
        at = obj.get("at")
        return cls(
            at=dt.datetime.fromisoformat(at) if at else None,
            attempt=int(obj.get("attempt", 0)),
            error=str(obj.get("error", "")),
            fence=int(obj.get("fence", 0) or 0),
            trace=str(obj.get("trace", "") or ""),
            rescue=str(obj.get("rescue", "") or ""),
            by=by if isinstance(by := obj.get("by"), int) and not isinstance(by, bool) else None,
        )


@dataclass(slots=True)
class AttemptLog:
    """The log lines of one attempt, each ending in a newline."""

    attempt: int
    log: str
    #: The attempt snoozed, which gives the attempt back: the next attempt has
    #: the same number. A job keeps only the latest snooze log per attempt.
    snoozed: bool = False


@dataclass(slots=True)
class Progress:
    """The last step a running job's worker recorded."""

    step: str
    cursor: JSON = None
    recorded_at: dt.datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "cursor": self.cursor,
            "at": self.recorded_at.isoformat() if self.recorded_at else None,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any] | None) -> Progress | None:
        if obj is None:
            return None
        at = obj.get("at")
        return cls(
            step=obj.get("step") or "",
            cursor=obj.get("cursor"),
            recorded_at=dt.datetime.fromisoformat(at) if at else None,
        )


@dataclass(slots=True)
class Dependency:
    """A finished direct dependency of a workflow step that reads it."""

    id: JobID
    step: str
    state: str
    output: JSON = None


@dataclass(slots=True)
class JobRow:
    """A job, live or from history (seed ``JobRow``).

    Optional fields are ``None`` where the seed says zero or empty.
    """

    id: JobID
    kind: str
    queue: str
    state: str
    priority: int
    attempt: int
    max_attempts: int
    scheduled_at: dt.datetime
    created_at: dt.datetime
    args: JSON = field(default_factory=dict)
    metadata: JSON = field(default_factory=dict)
    errors: list[AttemptError] = field(default_factory=list)
    attempted_at: dt.datetime | None = None
    #: The client holding the claim, or None (also for a job claimed by ID).
    attempted_by: int | None = None
    #: Numbers the job's claims; never repeats for a job.
    fence: int = 0
    unique_key: str | None = None
    ordering_key: str | None = None
    partition_key: str | None = None
    tags: list[str] = field(default_factory=list)
    batch_id: JobID | None = None
    expires_at: dt.datetime | None = None
    cancel_requested_at: dt.datetime | None = None
    lease_expires_at: dt.datetime | None = None
    awaited: bool = False
    snooze_reason: str | None = None
    progress: Progress | None = None
    finalized_at: dt.datetime | None = None
    output: JSON = None
    dependencies: list[Dependency] | None = None
    #: The job's step name within its workflow, or None (issue 5).
    step: str | None = None

    @property
    def is_live(self) -> bool:
        return self.finalized_at is None


@dataclass(slots=True)
class JobInsertResult:
    job: JobRow
    #: True when a job with the same unique key already existed; ``job`` is then
    #: that existing job.
    duplicate: bool = False


@dataclass(slots=True)
class JobClaimResult:
    jobs: list[JobRow]
    #: When positive, how long the rate limit will allow nothing.
    wait: dt.timedelta = dt.timedelta(0)


@dataclass(slots=True, frozen=True)
class JobFinalized:
    id: JobID
    fence: int


@dataclass(slots=True)
class RescueCandidate:
    job: JobRow
    #: True when selected for running longer than StuckAfter rather than for
    #: its client's expired lease.
    stuck: bool


@dataclass(slots=True)
class ClientRow:
    id: int
    hostname: str
    started_at: dt.datetime
    expires_at: dt.datetime
    info: JSON = field(default_factory=dict)


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


@dataclass(slots=True)
class QueueLimits:
    name: str
    global_limit: int = 0
    rate_per_sec: float = 0.0
    rate_burst: int = 0
    partition_limit: int = 0
    aging: dt.timedelta = dt.timedelta(0)

    @property
    def limited(self) -> bool:
        return bool(self.global_limit or self.rate_per_sec or self.partition_limit)


@dataclass(slots=True)
class QueueRow:
    name: str
    updated_at: dt.datetime
    limits: QueueLimits
    paused_at: dt.datetime | None = None


@dataclass(slots=True)
class Notification:
    channel: str
    payload: str


# ---------------------------------------------------------------------------
# Params (one frozen dataclass per method)


@dataclass(slots=True, frozen=True)
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
    limit: int
    #: Lock the queue row and apply its limits (issue 4).
    limited: bool = False
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
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
    now: dt.datetime | None = None


@dataclass(slots=True, frozen=True)
class LeaderParams:
    client_id: int
    ttl: dt.timedelta
    now: dt.datetime | None = None


# ---------------------------------------------------------------------------
# Capabilities


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


# ---------------------------------------------------------------------------
# The contract


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
        from django.db import connections

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
    def job_discard_expired(self, params: JobDiscardExpiredParams) -> list[JobRow]:
        """Move waiting jobs past their TTL to history as discarded."""

    @abstractmethod
    def job_rescue_candidates(self, params: JobRescueParams) -> list[RescueCandidate]:
        """Return running jobs whose client has no unexpired lease, plus (if
        ``stuck_after``) running jobs claimed longer ago than that."""

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
        from django_hopper.exceptions import NotSupported

        raise NotSupported(f"the {self.vendor} engine has no notifications; poll instead")


# -- periodic, history, upkeep (issue 6) --------------------------------------
#
# The seed's PeriodicInsert, PeriodicLastSlots, PeriodicRegister(ations),
# HistoryMaintain, HistoryIndex and JobsMaintain. Engines implement them in
# mixins (``engine/*/periodic.py`` and ``engine/*/history.py``) listed before
# BaseEngine in the engine class's bases.


@dataclass(slots=True, frozen=True)
class PeriodicInsertParams:
    #: The periodic job's name, the key of its slot row.
    name: str
    #: The slot the job is for; inserted only if later than the recorded last slot.
    slot: dt.datetime
    job: JobInsertParams
    now: dt.datetime | None = None


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


@dataclass(slots=True)
class PeriodicRegistrationRow:
    name: str
    definition: JSON
    digest: str
    client_id: int
    client_started_at: dt.datetime
    registered_at: dt.datetime


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


@dataclass(slots=True)
class HistoryIndexResult:
    #: Indexes built and attached this pass ("<partition>.<index>").
    built: list[str] = field(default_factory=list)
    #: Partitions whose build ran past the statement timeout (what it left is removed).
    timed_out: list[str] = field(default_factory=list)
    #: Parent indexes still invalid after the pass although every partition is indexed.
    invalid: list[str] = field(default_factory=list)
    #: Builds or attaches that could not lock in time; a later pass retries them.
    deferred: list[str] = field(default_factory=list)
    #: Set when another session holds the build lock: the index this pass would
    #: have built next. Nothing waited.
    busy: str = ""


@dataclass(slots=True, frozen=True)
class JobsMaintainParams:
    #: VACUUM a hot table once it has this many dead tuples.
    vacuum_dead_tuples: int = 100_000
    #: ANALYZE once this many rows changed since the last analyze ...
    analyze_changes: int = 100_000
    #: ... or when the planner's row estimate is off by this factor ...
    analyze_ratio: float = 10.0
    #: ... for a table of at least this many rows (either estimate).
    analyze_min_rows: int = 1_000


@dataclass(slots=True)
class JobsMaintainResult:
    #: Whether the live job table was vacuumed / analyzed.
    vacuumed: bool = False
    analyzed: bool = False
    #: What was done per hot table: "vacuumed", "analyzed" or "failed: <error>".
    tables: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class HistoryPartitionRow:
    """One partition of history, for ``hopper_partitions``."""

    name: str
    #: The day range of a partition hopper named; None for DEFAULT or foreign ones.
    lower: dt.datetime | None
    upper: dt.datetime | None
    #: The planner's estimate (reltuples), -1 if never analyzed.
    rows_estimate: int
    is_default: bool
    #: The bound as PostgreSQL prints it.
    bound: str = ""


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


# -- batches, workflows and awaiting (issue 5) ---------------------------------
#
# The seed's BatchInsert, BatchSettle, BatchGet, WorkflowInsert, WorkflowGet and
# WorkflowPromoteReady. Engines implement them in mixins (``engine/*/batches.py``
# and ``engine/*/workflows.py``). The rules that need no database (what a valid
# workflow is, how a callback is stored) are written once here; the rules that
# need atomicity (when a batch completes, when a dependent is promoted or fails)
# live inside single SQL statements of each engine.


class DependencyFailure:
    """What a dependent does when a dependency is canceled or discarded (seed
    ``DependencyFailure``; the values of ``models.DependencyFailure``)."""

    #: The dependent is canceled too, and so on down the graph.
    CANCEL = "cancel"
    #: The dependent is discarded.
    DISCARD = "discard"
    #: The dependent runs anyway and can read the dependency's state.
    RUN = "run"

    ALL: ClassVar[tuple[str, ...]] = (CANCEL, DISCARD, RUN)


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


@dataclass(slots=True)
class BatchRow:
    id: JobID
    #: Set for workflows.
    name: str | None
    #: The batch's jobs not yet finalized, as last folded by batch_settle.
    pending: int
    #: Its jobs that were canceled or discarded, as last folded.
    failed: int
    total: int
    #: Set once every job has been finalized (and the callbacks inserted).
    completed_at: dt.datetime | None
    created_at: dt.datetime
    metadata: JSON = field(default_factory=dict)
    is_workflow: bool = False


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
class JobEdge:
    job: JobID
    depends_on: JobID
    on_failure: str = DependencyFailure.CANCEL
    reads: bool = False


@dataclass(slots=True)
class WorkflowRow:
    batch: BatchRow
    #: In insertion order, live and finished alike.
    jobs: list[JobRow]
    edges: list[JobEdge]
    #: The names of the named steps, by job ID.
    steps: dict[JobID, str]


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


def validate_workflow(params: WorkflowInsertParams) -> None:
    """Refuse an invalid workflow with an InvalidJob naming the problem.

    Written once for both engines, and run before anything is written.
    """
    from django_hopper.exceptions import InvalidJob

    n = len(params.jobs)
    if not isinstance(params.name, str) or not params.name or len(params.name) > 255:
        raise InvalidJob(
            f"a workflow's name must be a non-empty string of at most 255 characters, "
            f"not {params.name!r}",
            field="name",
        )
    if n == 0:
        raise InvalidJob("a workflow needs at least one job", field="jobs")
    for i, p in enumerate(params.jobs):
        if p.unique_key is not None:
            raise InvalidJob(
                f"jobs[{i}] ({p.kind}) has a unique key; workflow jobs cannot have one, "
                "since a skipped duplicate would leave its dependents waiting forever",
                field="unique_key",
            )
        if p.batch_id is not None:
            raise InvalidJob(
                f"jobs[{i}] ({p.kind}) has a batch_id; the workflow is its batch",
                field="batch_id",
            )
    if params.steps:
        if len(params.steps) != n:
            raise InvalidJob(
                f"steps names {len(params.steps)} jobs but the workflow has {n}", field="steps"
            )
        seen: dict[str, int] = {}
        for i, step in enumerate(params.steps):
            if not isinstance(step, str) or len(step) > 255:
                raise InvalidJob(f"steps[{i}] must be a string, not {step!r}", field="steps")
            if step and step in seen:
                raise InvalidJob(
                    f"step name {step!r} is used twice (jobs[{seen[step]}] and jobs[{i}])",
                    field="steps",
                )
            seen[step] = i
    edges: set[tuple[int, int]] = set()
    after: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for k, d in enumerate(params.deps):
        for name in ("job", "depends_on"):
            v = getattr(d, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
                raise InvalidJob(
                    f"deps[{k}].{name} is {v!r}: an edge must join two jobs of the workflow "
                    f"(indexes 0..{n - 1})",
                    field="deps",
                )
        if d.job == d.depends_on:
            raise InvalidJob(f"deps[{k}]: jobs[{d.job}] cannot depend on itself", field="deps")
        if d.on_failure not in DependencyFailure.ALL:
            raise InvalidJob(
                f"deps[{k}].on_failure must be one of {', '.join(DependencyFailure.ALL)}, "
                f"not {d.on_failure!r}",
                field="on_failure",
            )
        if (d.job, d.depends_on) in edges:
            raise InvalidJob(
                f"deps[{k}]: jobs[{d.job}] depends on jobs[{d.depends_on}] twice", field="deps"
            )
        edges.add((d.job, d.depends_on))
        after[d.depends_on].append(d.job)
        indegree[d.job] += 1
    # Kahn's algorithm: whatever is left unvisited sits on a cycle.
    ready = [i for i in range(n) if indegree[i] == 0]
    visited = 0
    while ready:
        i = ready.pop()
        visited += 1
        for j in after[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if visited != n:
        names = params.steps or [""] * n
        cycle = [names[i] or f"jobs[{i}]" for i in range(n) if indegree[i] > 0]
        raise InvalidJob(
            f"the workflow's dependencies form a cycle through {', '.join(cycle[:10])}",
            field="deps",
        )


def check_batch_job(p: JobInsertParams) -> None:
    """Refuse a batch job with a unique key: the one rule, at every engine's insert.

    A duplicate is skipped (the insert returns the job holding the key), so the
    batch would wait forever for a job that was never inserted into it.
    """
    from django_hopper.exceptions import InvalidJob

    if p.batch_id is not None and p.unique_key is not None:
        raise InvalidJob(
            f"a job of batch {p.batch_id} cannot have a unique key ({p.unique_key!r}): a "
            "skipped duplicate would never finish the batch",
            field="unique_key",
        )


def callback_to_json(p: JobInsertParams | None) -> JSON:
    """Store a callback job's params as JSON (written once for both engines)."""
    if p is None:
        return None
    return {
        "kind": p.kind,
        "queue": p.queue,
        "priority": p.priority,
        "max_attempts": p.max_attempts,
        "args": p.args,
        "metadata": p.metadata,
        "tags": list(p.tags),
        "unique_key": p.unique_key,
        "unique_finished": list(p.unique_finished),
        "ordering_key": p.ordering_key,
        "partition_key": p.partition_key,
        "ttl": p.ttl.total_seconds() if p.ttl else None,
        "awaited": p.awaited,
    }


def callbacks_of(batch_id: JobID, failed: int, stored: Sequence[JSON]) -> list[JobInsertParams]:
    """Return the callback jobs a batch inserts on completion.

    ``stored`` is (on_success, on_failure, on_complete) as callback_to_json
    made them: on_success if no job failed, on_failure otherwise, on_complete
    either way; each one's metadata gains ``batch_id``.
    """
    on_success, on_failure, on_complete = stored
    chosen = [on_failure if failed else on_success, on_complete]
    out: list[JobInsertParams] = []
    for obj in chosen:
        if isinstance(obj, str):
            import json

            obj = json.loads(obj)
        if not obj:
            continue
        meta = dict(obj.get("metadata") or {})
        meta["batch_id"] = str(batch_id)
        ttl = obj.get("ttl")
        out.append(
            JobInsertParams(
                kind=obj["kind"],
                queue=obj.get("queue") or "default",
                priority=int(obj.get("priority") or 0),
                max_attempts=int(obj.get("max_attempts") or 25),
                args=obj.get("args") if obj.get("args") is not None else {},
                metadata=meta,
                tags=tuple(obj.get("tags") or ()),
                unique_key=obj.get("unique_key"),
                unique_finished=tuple(obj.get("unique_finished") or ()),
                ordering_key=obj.get("ordering_key"),
                partition_key=obj.get("partition_key"),
                ttl=dt.timedelta(seconds=ttl) if ttl else None,
                awaited=bool(obj.get("awaited")),
            )
        )
    return out


# -- queue controls (issue 4) -------------------------------------------------
#
# The seed's JobRetryOrderingKey, JobAge, QueuePause, QueueResume,
# QueueSetLimits and Stats, plus the queue row the limited claim path locks.
# Engines implement them in mixins (``engine/*/queues.py`` and
# ``engine/*/stats.py``); the token bucket and the limited claim's arithmetic
# are written once, in :mod:`django_hopper.engine.limits`.

#: The metadata key that marks a running job of a woken ordering key: if its
#: attempt ends in a snooze or a retry, the claim takes it at once.
WAKE_MARKER = "_hopper_wake"


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


@dataclass(slots=True)
class QueueStats:
    available: int = 0
    scheduled: int = 0
    retryable: int = 0
    running: int = 0
    #: Age of the oldest job that could be claimed now, or zero.
    oldest_available: dt.timedelta = dt.timedelta(0)
    completed_last_minute: int = 0
    paused: bool = False


@dataclass(slots=True)
class Stats:
    queues: dict[str, QueueStats] = field(default_factory=dict)
    #: Clients with an unexpired lease.
    live_clients: int = 0
    #: The leader's client ID, or None when the lease is free or expired.
    leader: int | None = None
    running_by_client: dict[int, int] = field(default_factory=dict)


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


# == job leases and the step ledger (claim by ID, resumable jobs) ==============
#
# The seed's JobClaimByID, JobLeaseRenew and JobExpireLeases, and the step
# ledger of seed 004's JobRunStore (beginStep, recordStep, commitPass) fenced
# with hopper's claim. Engines implement them in ``engine/*/leases.py`` and
# ``engine/*/steps.py``. Every write is conditional on the claim that makes it:
# the client and fence, or, for a job claimed by ID, the lease token and fence
# (the one ownership test, spelled in each statement as the finalize spells it).


@dataclass(slots=True, frozen=True)
class LeaseFence:
    """A job lease: the random token the claim by ID generated, and the claim's fence."""

    token: JobID
    fence: int


@dataclass(slots=True, frozen=True)
class JobClaimByIDParams:
    id: JobID
    #: The fence the job must have (0 for a job never claimed); another raises JobFenced.
    fence: int
    #: The lease's time to live from each claim or renewal (at least a microsecond).
    ttl: dt.timedelta
    now: dt.datetime | None = None


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


#: The error recorded on a job whose lease expired.
LEASE_EXPIRED_ERROR = "job lease expired"


def rescued_state(job: JobRow) -> str:
    """Return how hopper ends an attempt it takes from a holder that stopped reporting.

    Canceled if a cancel was requested, discarded on the last attempt, retryable
    otherwise: the one rule for the rescuer and for lease expiry.
    """
    if job.cancel_requested_at is not None:
        return "canceled"
    if job.attempt >= job.max_attempts:
        return "discarded"
    return "retryable"


def lease_expiry_result(job: JobRow, token: JobID) -> JobFinalize:
    """Return how an expired lease ends ``job``'s attempt: the rule, written once.

    Canceled if a cancel was requested, else discarded on the last attempt,
    else retryable at once (the holder is gone; a backoff would only delay the
    takeover). Fenced to the lease, so a holder that finishes first wins.
    """
    err = AttemptError(
        at=None,
        attempt=job.attempt,
        error=LEASE_EXPIRED_ERROR,
        fence=job.fence,
        rescue=RescueReason.LEASE_EXPIRED,
    )
    return JobFinalize(
        id=job.id,
        attempted_by=None,
        fence=job.fence,
        state=rescued_state(job),
        error=err,
        lease_token=token,
    )


@dataclass(slots=True)
class JobStepRow:
    """One named step of a resumable job's current pass (table hopper_job_step)."""

    job_id: JobID
    step: str
    #: True once the step succeeded; ``result`` is then its memoized value.
    done: bool
    result: JSON = None
    #: Tries recorded, failed or not, across the passes since the last commit.
    attempts: int = 0
    last_error: str | None = None
    recorded_at: dt.datetime | None = None


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
    #: passes (seed 004: a committed pass clears the attempts).
    reset_attempt: bool = False
    now: dt.datetime | None = None


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
        after the lease was last renewed (and no later than now), at the first
        such start plus the larger of the lease's TTL and ``grace``, if later.
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


# == pub/sub and streams =======================================================
#
# The seed's SubscriptionUpsert, SubscriptionList, MessagePublish and
# StreamAppend, StreamRead, StreamConsumerUpsert, StreamConsumerList,
# StreamConsumerSeek, StreamPump (plus a retention prune of stream events).
# Engines implement them in ``engine/*/pubsub.py`` and ``engine/*/streams.py``.
# The rules that need no database (what a topic and a pattern are, how a
# pattern matches, what a delivery job looks like) are written once, in
# :mod:`django_hopper.engine.topics`; what a pump may deliver without skipping
# a late commit is each engine's SQL (docs/pubsub-and-streams.md).


class StreamStart:
    """Where a new stream consumer starts (seed ``StreamStart``)."""

    #: Before every retained event.
    EARLIEST = "earliest"
    #: Past every event appended so far (the default).
    LATEST = "latest"

    ALL: ClassVar[tuple[str, ...]] = (EARLIEST, LATEST)


@dataclass(slots=True)
class SubscriptionRow:
    name: str
    #: An AMQP topic pattern: words separated by '.', '*' one word, '#' zero or more.
    pattern: str
    #: The delivery job's kind (a ``@job`` function called as ``fn(message)``).
    kind: str
    queue: str = "default"
    #: The deliveries' retry budget, or 0 for the default (25, or 10 with an
    #: ordering key).
    max_attempts: int = 0
    #: Merged into every delivery's metadata.
    metadata: JSON = field(default_factory=dict)
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


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


@dataclass(slots=True, frozen=True, order=True)
class StreamPosition:
    """A place in the stream log: (transaction id, sequence).

    On an engine with ``supports_xid_streams`` ``xid`` is the appending
    transaction's id; elsewhere it is 0 and ``seq`` alone orders the log.
    """

    xid: int = 0
    seq: int = 0

    def __bool__(self) -> bool:
        return bool(self.xid or self.seq)


@dataclass(slots=True)
class StreamEvent:
    position: StreamPosition
    topic: str
    payload: JSON = None
    #: If set, the ordering key of the event's deliveries.
    key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    message_id: str = ""
    created_at: dt.datetime | None = None


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


@dataclass(slots=True)
class StreamConsumerRow:
    name: str
    pattern: str
    kind: str
    queue: str = "default"
    #: The deliveries' retry budget, or 0 for the default (25, or 10 for
    #: events with a key).
    max_attempts: int = 0
    metadata: JSON = field(default_factory=dict)
    #: Applies when the consumer is created (StreamStart).
    start: str = StreamStart.LATEST
    #: The engine's record of what the consumer has read: with
    #: ``supports_xid_streams`` the pg_snapshot every delivered transaction is
    #: visible in; None elsewhere.
    snapshot: str | None = None
    #: The last event delivered of the delta being read (see the docs); with a
    #: single writer, the last event delivered or skipped.
    position: StreamPosition = StreamPosition()
    delivered_at: dt.datetime | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


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


def claim_by_id_refusal(status: str, id: JobID) -> Exception:
    """Return the error a claim by ID refused with ``status`` raises (the engines'
    statements name the first rule that applies; the words are written here once)."""
    from django_hopper.exceptions import JobFenced, JobNotClaimable, JobRunning, NotFound

    if status == "not_found":
        return NotFound(f"job {id} does not exist")
    if status == "finished":
        return JobNotClaimable(f"job {id} has finished; retry it to run it again")
    if status == "fenced":
        return JobFenced(f"job {id} is at another fence: another claim took it")
    if status == "running":
        return JobRunning(f"job {id} is running")
    return JobNotClaimable(
        f"job {id} cannot be claimed now: pending, past its TTL, in a paused queue, "
        "or behind an older job of its ordering key"
    )


def step_from_row(
    job_id: JobID,
    step: str,
    result: JSON,
    attempts: int,
    last_error: str | None,
    recorded_at: dt.datetime | None,
) -> JobStepRow:
    """Build a step row from the stored columns: ``result`` is ``{"value": ...}`` once done."""
    done = result is not None
    return JobStepRow(
        job_id=job_id,
        step=step,
        done=done,
        result=result.get("value") if done and isinstance(result, dict) else None,
        attempts=int(attempts or 0),
        last_error=last_error,
        recorded_at=recorded_at,
    )
