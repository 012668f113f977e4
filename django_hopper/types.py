"""Hopper's public vocabulary and the rows users receive.

Everything here is plain Python: it imports neither settings nor the app
registry, so any module (models, migrations, engines, a module of jobs loaded
while the registry is still filling) can import it. It is the one place where
the job states, the priority range, the notification channels and the control
messages are spelled; ``models.py`` builds its choices and constraints from
it, and the engines and the runtime import it rather than copy it.

The rows (``JobRow``, ``AttemptError``, ``Progress``, ...) are what
``get_job()``, ``JobHandle``, the signals and the listings hand to users. They
are documented and stable; the engine's params are internal
(:mod:`django_hopper.engine.params`).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Self

JobID = uuid.UUID
JSON = Any  # a value that json.dumps accepts


# ---------------------------------------------------------------------------
# Vocabularies


class Vocabulary(StrEnum):
    """A closed set of words; members are their own string values."""

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """Return every word, in declaration order."""
        return tuple(m.value for m in cls)


class JobState(Vocabulary):
    """Where a job is in its life; see ARCHITECTURE.md for the state machine."""

    PENDING = "pending"
    AVAILABLE = "available"
    SCHEDULED = "scheduled"
    RETRYABLE = "retryable"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELED = "canceled"
    DISCARDED = "discarded"


#: States of jobs in the live table.
LIVE_STATES: tuple[JobState, ...] = (
    JobState.PENDING,
    JobState.AVAILABLE,
    JobState.SCHEDULED,
    JobState.RETRYABLE,
    JobState.RUNNING,
)
#: Live states of jobs not running: what cancel, delete and retry may act on at once.
WAITING_STATES: tuple[JobState, ...] = (
    JobState.PENDING,
    JobState.AVAILABLE,
    JobState.SCHEDULED,
    JobState.RETRYABLE,
)
#: States of jobs in history.
FINAL_STATES: tuple[JobState, ...] = (JobState.COMPLETED, JobState.CANCELED, JobState.DISCARDED)

#: The priority range, Django Tasks' convention: higher runs first, default 0.
PRIORITY_MIN = -100
PRIORITY_MAX = 100


class ConflictAction(Vocabulary):
    """What an insert does with an input whose unique key matches a live job."""

    #: Return the existing job as a duplicate.
    SKIP = "skip"
    #: Replace the existing job's args, metadata, priority, max attempts and
    #: schedule unless it is running; it is still returned as a duplicate.
    REPLACE = "replace"


class RescueReason(Vocabulary):
    """Why hopper, not the attempt, ended an attempt (``AttemptError.rescue``)."""

    CLIENT_EXPIRED = "client_expired"
    STUCK = "stuck"
    LEASE_EXPIRED = "lease_expired"
    TTL_EXPIRED = "ttl_expired"
    CANCELED = "canceled"
    DEPENDENCY_FAILED = "dependency_failed"
    #: The job's stored values do not decode (JobRow.decode_error), so it could not run.
    UNDECODABLE = "undecodable"
    #: A resumable run's claims kept missing their BEGIN (docs/resumable.md, "Admission misses").
    ADMISSION_MISSED = "admission_missed"


class DependencyFailure(Vocabulary):
    """What a workflow job does when a dependency is canceled or discarded."""

    #: The dependent is canceled too, and so on down the graph.
    CANCEL = "cancel"
    #: The dependent is discarded.
    DISCARD = "discard"
    #: The dependent runs anyway and can read the dependency's state.
    RUN = "run"


class StreamStart(Vocabulary):
    """Where a new stream consumer starts."""

    #: Before every retained event.
    EARLIEST = "earliest"
    #: Past every event appended so far (the default).
    LATEST = "latest"


#: The metadata key that marks a running job of a woken ordering key: if its
#: attempt ends in a snooze or a retry, the claim takes it at once.
WAKE_MARKER = "_hopper_wake"

#: The error recorded on a job whose lease expired.
LEASE_EXPIRED_ERROR = "job lease expired"


# ---------------------------------------------------------------------------
# Notifications


class Channel(Vocabulary):
    """Notification channels (LISTEN/NOTIFY on PostgreSQL)."""

    #: Payload: a queue name. Jobs became claimable there.
    INSERT = "hopper_insert"
    #: Payload: a ControlMessage.
    CONTROL = "hopper_control"
    #: Payload: the ID of a finalized awaited job.
    DONE = "hopper_done"
    #: Payload: a topic. Events were appended.
    STREAM = "hopper_stream"
    #: Payload: a ControlMessage (RESIGNED). The leader gave up its lease.
    LEADER = "hopper_leader"


CHANNEL_INSERT = Channel.INSERT
CHANNEL_CONTROL = Channel.CONTROL
CHANNEL_DONE = Channel.DONE
CHANNEL_STREAM = Channel.STREAM
CHANNEL_LEADER = Channel.LEADER


class ControlAction(Vocabulary):
    """What a control message asks the clients to do."""

    #: Cancel a running job (``job_id``).
    CANCEL = "cancel"
    #: Stop / start claiming from ``queue``.
    PAUSE = "pause"
    RESUME = "resume"
    #: ``queue``'s limits changed; ``limited`` says which claim path it takes now.
    LIMITS = "limits"
    #: The leader (``client_id``) resigned: elect another.
    RESIGNED = "resigned"


@dataclass(slots=True, frozen=True)
class ControlMessage:
    """A message on CHANNEL_CONTROL or CHANNEL_LEADER: built here, parsed here."""

    action: ControlAction
    queue: str | None = None
    job_id: JobID | None = None
    limited: bool | None = None
    client_id: int | None = None

    @classmethod
    def cancel(cls, job_id: JobID) -> Self:
        return cls(ControlAction.CANCEL, job_id=job_id)

    @classmethod
    def pause(cls, queue: str) -> Self:
        return cls(ControlAction.PAUSE, queue=queue)

    @classmethod
    def resume(cls, queue: str) -> Self:
        return cls(ControlAction.RESUME, queue=queue)

    @classmethod
    def limits(cls, queue: str, limited: bool) -> Self:
        return cls(ControlAction.LIMITS, queue=queue, limited=limited)

    @classmethod
    def resigned(cls, client_id: int) -> Self:
        return cls(ControlAction.RESIGNED, client_id=client_id)

    def payload(self) -> str:
        """Return the notification payload: a JSON object of the fields that are set."""
        out: dict[str, Any] = {"action": self.action.value}
        if self.queue is not None:
            out["queue"] = self.queue
        if self.job_id is not None:
            out["job_id"] = str(self.job_id)
        if self.limited is not None:
            out["limited"] = self.limited
        if self.client_id is not None:
            out["client_id"] = self.client_id
        return json.dumps(out)

    @classmethod
    def parse(cls, payload: str) -> Self | None:
        """Return the message a payload carries, or None for one this release cannot read.

        A reader treats None as "something changed" and renews its view.
        """
        try:
            obj = json.loads(payload)
            action = ControlAction(obj["action"])
            queue = obj.get("queue")
            job_id = obj.get("job_id")
            limited = obj.get("limited")
            client_id = obj.get("client_id")
            msg = cls(
                action,
                queue=str(queue) if queue is not None else None,
                job_id=uuid.UUID(str(job_id)) if job_id is not None else None,
                limited=bool(limited) if limited is not None else None,
                client_id=int(client_id) if client_id is not None else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        needs = {
            ControlAction.CANCEL: msg.job_id,
            ControlAction.PAUSE: msg.queue,
            ControlAction.RESUME: msg.queue,
            ControlAction.LIMITS: msg.queue,
            ControlAction.RESIGNED: msg.client_id,
        }[action]
        return msg if needs is not None and needs != "" else None


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
    """A job, live or from history.

    An optional field that was never set (no schedule yet, no output, no
    finalize time) is ``None`` rather than a zero value, so "unset" and
    "zero" never look alike.
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
    #: The job's step name within its workflow, or None.
    step: str | None = None
    #: The data subject whose data the job carries (``erase_subject`` finds the
    #: job by it), or None; cleared by the erasure.
    subject: str | None = None
    #: When ``erase_subject`` removed the job's data, or None. An erased job
    #: reads with its arguments, metadata, tags, keys, errors, progress and
    #: output empty.
    erased_at: dt.datetime | None = None
    #: Why stored values of this row do not decode (``"progress: expected a JSON
    #: object, not a list"``), or None. The fields it names read as their empty
    #: value; a claim fails such a job's attempt instead of running it
    #: (docs/engine-semantics.md, "Values that do not decode").
    decode_error: str | None = None

    @property
    def is_live(self) -> bool:
        return self.finalized_at is None


@dataclass(slots=True)
class ClientRow:
    id: int
    hostname: str
    started_at: dt.datetime
    expires_at: dt.datetime
    info: JSON = field(default_factory=dict)


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


@dataclass(slots=True)
class PeriodicRegistrationRow:
    name: str
    definition: JSON
    digest: str
    client_id: int
    client_started_at: dt.datetime
    registered_at: dt.datetime


@dataclass(slots=True)
class PeriodicSlotRow:
    """A periodic job's recorded state: its last slot, and whether it is disabled."""

    name: str
    #: The last slot inserted (None: none yet).
    last_slot: dt.datetime | None = None
    #: The job the last slot inserted.
    job_id: JobID | None = None
    inserted_at: dt.datetime | None = None
    #: When an operator disabled it (None: enabled). A disabled job's slots are skipped.
    disabled_at: dt.datetime | None = None
    #: When an operator last enabled it: slots before then are never caught up.
    enabled_at: dt.datetime | None = None

    @property
    def settled(self) -> dt.datetime | None:
        """Return the time up to which no slot is due any more (inserted, or skipped
        while disabled)."""
        times = [t for t in (self.last_slot, self.enabled_at) if t is not None]
        return max(times) if times else None


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


@dataclass(slots=True)
class ErasureRow:
    """That a data subject's data was erased: when, and how many rows. Never the data.

    ``subject_digest`` is the SHA-256 of the subject key (hex), so whoever
    knows the subject can find its erasures and the record names nobody.
    """

    id: int
    subject_digest: str
    erased_at: dt.datetime
    #: Job rows erased, live and history; ``running`` of them had an attempt
    #: running, which the erasure fenced.
    jobs: int = 0
    running: int = 0
    #: Step-ledger rows, attempt logs and dependency results deleted.
    steps: int = 0
    logs: int = 0
    results: int = 0
    #: The live jobs the erasure ended (discarded), those of them that were
    #: running, and their batches.
    ended: list[JobID] = field(default_factory=list)
    fenced: list[JobID] = field(default_factory=list)
    batches: list[JobID] = field(default_factory=list)


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
    #: The states whose count reached the read's limit (``stats_bounded`` only):
    #: the count shown is that limit, and the true number is at least that.
    capped: tuple[str, ...] = ()


@dataclass(slots=True)
class Stats:
    queues: dict[str, QueueStats] = field(default_factory=dict)
    #: Clients with an unexpired lease.
    live_clients: int = 0
    #: The leader's client ID, or None when the lease is free or expired.
    leader: int | None = None
    running_by_client: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class LeaseFence:
    """A job lease: the random token the claim by ID generated, and the claim's fence."""

    token: JobID
    fence: int


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
    #: When an operator paused it (None: delivering). A publish still makes a
    #: paused subscription's deliveries, held (scheduled at HELD_AT) until resumed.
    paused_at: dt.datetime | None = None


#: The scheduled time of a delivery held by a paused subscription: later than
#: any real schedule, so nothing promotes it until the subscription is resumed.
HELD_AT = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)


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
    #: Why a stored column would not decode (the field named), or None. Such an
    #: event reads back with that column empty; a pump delivers it as a failure.
    decode_error: str | None = None


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
    #: When an operator paused it (None: pumped). A paused consumer's events
    #: wait in the log (within retention) at its position.
    paused_at: dt.datetime | None = None


@dataclass(slots=True)
class StreamConsumerLag:
    """How far a consumer is behind, read from a window of its next waiting events."""

    name: str
    #: Waiting events its pattern matches, among the window read.
    events: int = 0
    #: More events wait than the window held: ``events`` is a floor.
    capped: bool = False
    #: When the first matching waiting event was appended (None: none in the window).
    oldest_at: dt.datetime | None = None


class JobOutcome:
    """What a ``*_many`` operator method did to each job: the one-job method's result or error."""

    CANCELED = "canceled"  # a waiting job, now in history
    CANCEL_REQUESTED = "cancel_requested"  # a running job, asked to stop
    FINISHED = "finished"  # already finished: a cancel changes nothing
    RETRIED = "retried"  # available now (or pending, if it waits on dependencies)
    DELETED = "deleted"
    RUNNING = "running"  # refused: JobRunning (retry, delete)
    UNIQUE_CONFLICT = "unique_conflict"  # refused: UniqueConflict (retry)
    NOT_FOUND = "not_found"  # refused: NotFound
    ERASED = "erased"  # refused: JobErased (retry)

    #: The outcomes that changed nothing because the one-job method would raise.
    REFUSALS = frozenset({RUNNING, UNIQUE_CONFLICT, NOT_FOUND, ERASED})


@dataclass(slots=True)
class JobManyResult:
    #: Every requested ID (duplicates once), with its JobOutcome.
    outcomes: dict[JobID, str]
    #: The jobs changed, as they are afterwards (deleted ones: as they were).
    jobs: list[JobRow] = field(default_factory=list)

    def ids(self, outcome: str) -> list[JobID]:
        """Return the IDs with this outcome, in request order."""
        return [i for i, o in self.outcomes.items() if o == outcome]
