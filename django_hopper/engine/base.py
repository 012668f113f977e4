"""The engine contract: what every database engine implements.

This is hopper's internal API between the layers above (api, runtime,
maintenance) and the SQL below, method by method, named entity first as River
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

import dataclasses
import datetime as dt
import hashlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import connections, transaction

from django_hopper import validation
from django_hopper.engine import checks, outcomes, rules, topics
from django_hopper.engine.decode import refuse_undecodable_lease
from django_hopper.engine.limits import validate_limits
from django_hopper.engine.outcomes import OperatorRows
from django_hopper.engine.params import (
    BatchDuplicatesParams,
    BatchDuplicatesResult,
    BatchInsertParams,
    BatchSettleParams,
    BatchSettleResult,
    ClientRegisterParams,
    ClientRenewParams,
    ClientRenewResult,
    HistoryIndexDeclareParams,
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
    JobPassBeginParams,
    JobPassBegun,
    JobPassGetManyParams,
    JobPassMissed,
    JobPassMissParams,
    JobPassRow,
    JobPassTaken,
    JobPassTakeoverParams,
    JobRecordProgressParams,
    JobRescueParams,
    JobRetryManyParams,
    JobRetryOrderingKeyParams,
    JobRetryParams,
    JobReturnManyParams,
    JobScheduleParams,
    JobsMaintainParams,
    JobsMaintainResult,
    JobStepGetParams,
    JobStepRecordParams,
    JobStepsClearParams,
    LeaderParams,
    MessagePublishParams,
    PeriodicDisableParams,
    PeriodicEnableParams,
    PeriodicInsertParams,
    PeriodicRegisterParams,
    PeriodicRunNowParams,
    PeriodicRunNowResult,
    RescueCandidate,
    RouteDeleteResult,
    SchemaLockParams,
    SchemaState,
    StatsBoundedParams,
    StreamAppendParams,
    StreamConsumerDeleteParams,
    StreamConsumerLagParams,
    StreamConsumerPauseParams,
    StreamConsumerResetParams,
    StreamConsumerResumeParams,
    StreamPruneParams,
    StreamPumpResult,
    StreamReadParams,
    StreamSeekParams,
    SubjectEraseParams,
    SubscriptionDeleteParams,
    SubscriptionPauseParams,
    SubscriptionResumeParams,
    SubscriptionResumeResult,
    WorkflowInsertParams,
    WorkflowInsertResult,
    WorkflowPromoteParams,
    WorkflowPromoteResult,
)
from django_hopper.exceptions import (
    HistoryIndexRepairError,
    InvalidJob,
    JobLocked,
    NotSupported,
)
from django_hopper.ids import new_id
from django_hopper.types import (
    CHANNEL_CONTROL,
    CHANNEL_INSERT,
    AttemptLog,
    BatchRow,
    ClientRow,
    ControlMessage,
    ErasureRow,
    HistoryPartitionRow,
    JobID,
    JobManyResult,
    JobOutcome,
    JobRow,
    JobState,
    JobStepRow,
    Notification,
    PeriodicRegistrationRow,
    PeriodicSlotRow,
    Progress,
    QueueLimits,
    QueueRow,
    Stats,
    StreamConsumerLag,
    StreamConsumerRow,
    StreamEvent,
    StreamStart,
    SubscriptionRow,
    WorkflowRow,
)

#: Jobs per statement when a delete cancels a subscription's or consumer's deliveries.
CANCEL_CHUNK = 1_000

#: Seconds a queue whose keyless claim found keyed candidates is claimed by the
#: full statement alone before the keyless one is tried again.
KEYED_RECHECK = 1.0

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


@dataclass(slots=True, frozen=True)
class EngineFeatures:
    """What an engine can do. Branch on these, never on vendor."""

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
    #: Indexes are built without blocking writes (CREATE INDEX CONCURRENTLY),
    #: so an interrupted build can leave an invalid index for history_index to
    #: repair. Where a build blocks writes it either completes or leaves nothing.
    supports_concurrent_index_builds: bool = False
    #: Per-table storage parameters (autovacuum thresholds for the hot tables).
    supports_storage_parameters: bool = False
    #: Stream positions carry transaction ids (xid8) and consumers read through
    #: snapshots (pg_snapshot), so an event whose transaction commits late is
    #: still delivered; without it, one writer makes sequence order commit order.
    supports_xid_streams: bool = False
    #: The claim runs as a server-side prepared statement whose first runs on a
    #: connection are planned for their values (PostgreSQL plans five, then reuses
    #: its generic plan): a producer runs its claims once with no client at start
    #: (``Producer.warm_up``), so that its first jobs do not wait for the planning.
    plans_prepared_claims: bool = False


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
    """One database engine: the whole contract, grouped by entity.

    The public methods are the shared front, written once: each validates its
    params (:mod:`django_hopper.engine.checks`), skips the database when there
    is nothing to do, decides which notifications go out, and calls one vendor
    hook (``_job_insert_many`` ...). A vendor implements the hooks only: run
    the SQL and convert the rows. Stateless apart from its alias: every call
    uses the current thread's Django connection for that alias, and a hint
    of which queues had keyed jobs lately, which picks a claim statement and
    never changes what a claim returns.
    """

    vendor: ClassVar[str]
    features: ClassVar[EngineFeatures]

    def __init__(self, alias: str) -> None:
        self.alias = alias
        #: Queue -> monotonic time until which its unlimited claims go straight
        #: to the full statement (its keyless one found keyed candidates).
        self._keyed_until: dict[str, float] = {}

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    def listener(self) -> Listener:
        """Open a dedicated connection for notifications (only if ``supports_listen``)."""
        raise NotSupported(f"the {self.vendor} engine has no notifications; poll instead")

    # == time and schema =======================================================

    @abstractmethod
    def now(self) -> dt.datetime:
        """Return the database clock (aware, UTC)."""

    def schema_version(self) -> int:
        """Return the number of the newest applied hopper migration, or 0.

        Takes no lock, so it never waits for a migration in progress.
        """
        return self._schema_state().version

    def schema_state(self) -> SchemaState:
        """Return the schema's version and the oldest code version it serves.

        One cheap read of ``django_migrations`` (and of the floor table once it
        exists), taking no lock: a worker calls it at start.
        """
        return self._schema_state()

    def schema_check(self) -> SchemaState:
        """Return the schema's state if this code goes with it; else refuse.

        Raises :class:`~django_hopper.exceptions.SchemaMismatch`, naming the
        database's version, the code's and what to run, when migrations this
        code needs are missing or an applied migration no longer serves code
        this old (``rules.schema_mismatch``). Workers call it at start.
        """
        state = self._schema_state()
        rules.schema_mismatch(state, rules.code_version(), self.alias)
        return state

    def index_valid(self, name: str) -> bool | None:
        """Return whether the index ``name`` is valid, or None if there is none.

        An interrupted concurrent build leaves an invalid one; a migration run
        again rebuilds it instead of failing on its name.
        """
        checks.index_name(name)
        return self._index_valid(name)

    @contextmanager
    def schema_lock(self, params: SchemaLockParams | None = None) -> Iterator[None]:
        """Hold the cross-process migration lock of this database for the block.

        The lock lives on a dedicated connection, never one of Django's, so the
        migrations run on their own connection beside it and a process waiting
        for the lock holds no connection the holder needs. It is polled every
        ``poll_interval`` seconds, and ``on_wait`` hears once who holds it.
        Closing the connection releases it, so a holder that dies frees it.
        """
        params = params or SchemaLockParams()
        checks.schema_lock(params)
        handle = self._schema_lock_open()
        try:
            told = False
            while not self._schema_lock_try(handle):
                if not told and params.on_wait is not None:
                    params.on_wait(self._schema_lock_holder(handle))
                    told = True
                time.sleep(params.poll_interval)
            yield
        finally:
            self._schema_lock_close(handle)

    # == jobs ==================================================================

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

        A duplicate input of a batch counts toward that batch's progress in the
        same transaction (``batch_count_duplicates``), and the batches it
        counted for are settled: a batch never waits for a job that was not
        inserted into it.
        """
        if not params:
            return []
        checks.insert_opts(opts)
        for p in params:
            checks.insert(p)
        if len(params) == 1:  # every enqueue(): no generator to run over one input
            counts = params[0].batch_id is not None and params[0].unique_key is not None
        else:
            counts = any(p.batch_id is not None and p.unique_key is not None for p in params)
        if not counts:
            return self._job_insert_many(params, opts)
        with transaction.atomic(using=self.alias):
            results = self._job_insert_many(params, opts)
            duplicates = tuple(
                (p.batch_id, r.job.id)
                for p, r in zip(params, results, strict=True)
                if r.duplicate and p.batch_id is not None and r.job.batch_id != p.batch_id
            )
            if duplicates:
                counted = self.batch_count_duplicates(BatchDuplicatesParams(duplicates))
                if counted.batches:
                    self.batch_settle(BatchSettleParams(ids=counted.batches, now=opts.now))
        return results

    def job_insert_copy(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = JobInsertOpts()
    ) -> list[JobInsertResult]:
        """Bulk-load jobs without conflict handling (only if ``supports_copy``)."""
        if not self.features.supports_copy:
            raise NotSupported(f"the {self.vendor} engine has no COPY; use job_insert_many")
        if not params:
            return []
        for p in params:
            checks.insert(p, copy=True)
        results = self._job_insert_copy(params, opts)
        if opts.notify:
            self._send(outcomes.woken([r.job for r in results if not r.duplicate]))
        return results

    def job_claim(self, params: JobClaimParams) -> JobClaimResult:
        """Move up to ``limit`` claimable jobs of a queue to running, atomically.

        Claimable: available, or scheduled/retryable with scheduled_at passed;
        not expired (TTL); queue not paused. Order: priority (higher first),
        then scheduled_at, then ID. Each claimed job gets fence+1, attempt+1,
        attempted_at = now, attempted_by = client, snooze reason cleared.
        """
        ahead = checks.limit(params.ahead, "ahead")
        if params.limited and ahead:
            # A queue's limits count what runs; a job held in a buffer would
            # take a place it does not use, so the limited path never claims ahead.
            params = dataclasses.replace(params, ahead=0)
            ahead = 0
        if checks.limit(params.limit) + ahead == 0:
            return JobClaimResult(jobs=[])
        validation.queue_name(params.queue)
        if params.limited:
            return self._job_claim_limited(params)
        # A queue without keyed candidates is claimed by the keyless statement,
        # which claims exactly what the full one would: its probe for keyed
        # candidates reads the snapshot its claim reads, so a keyed job it does
        # not see is one the full statement would not see either. When it
        # finds some, it claims nothing and the full statement runs; the
        # queue then skips the probe for KEYED_RECHECK seconds.
        queue = params.queue
        if time.monotonic() >= self._keyed_until.get(queue, 0.0):
            result = self._job_claim_keyless(params)
            if result is not None:
                return result
            self._keyed_until[queue] = time.monotonic() + KEYED_RECHECK
        return self._job_claim(params)

    def job_return_many(self, params: JobReturnManyParams) -> list[JobID]:
        """Give back jobs claimed ahead of a free slot that never started; return their IDs.

        Each job still running in the client's claim at the given fence, marked
        claimed ahead and without a cancel request becomes available again (or
        scheduled, if its time is still to come) with its attempt given back:
        no handler ran, so neither an attempt nor an admission miss is counted.
        The fence stays bumped, so no result of that claim can apply later. A
        job left out (rescued meanwhile, or with a cancel requested) is not
        returned. The queues that got jobs back are woken.
        """
        checks.return_many(params)
        if not params.jobs:
            return []
        returned = self._job_return_many(params)
        self._send(outcomes.woken_queues([queue for _id, queue in returned]))
        return [id for id, _queue in returned]

    def job_schedule(self, params: JobScheduleParams) -> int:
        """Make due scheduled and retryable jobs available; return how many."""
        if params.queue is not None:
            validation.queue_name(params.queue)
        if checks.limit(params.limit) == 0:
            return 0
        count, queues = self._job_schedule(params)
        self._send(outcomes.woken_queues(queues))
        return count

    def job_finalize_many(self, params: JobFinalizeParams) -> list[JobFinalized]:
        """Apply a batch of results in one statement, each fenced to its claim.

        A result applies only if its job is still running, owned by the same
        client (or lease) at the same fence. Returns the applied results; the
        caller treats the rest as fenced.

        ``skip_locked`` does not apply to the results of leased jobs: a lease
        holder's outcome waits for the row, so it is applied or fenced, never
        silently skipped.
        """
        checks.limit(params.keep_logs, "keep_logs")
        if not params.jobs:
            return []
        checks.finalize(params.jobs)
        if params.skip_locked and any(f.lease_token is not None for f in params.jobs):
            params = dataclasses.replace(params, skip_locked=False)
        return self._job_finalize_many(params)

    def job_record_progress(self, params: JobRecordProgressParams) -> Progress | None:
        """Store a running job's progress, fenced like a finalize.

        Returns the progress as stored, or None if the attempt no longer owns
        the job. With ``no_wait``, raises JobLocked at once if another
        transaction holds the row (on a single-writer engine: if another
        transaction writes), so a caller that must not block never does.
        With ``keep_step`` the stored step is kept and ``step`` is ignored.
        """
        checks.record_progress(params)
        try:
            return self._job_record_progress(params)
        except JobLocked as exc:
            raise outcomes.locked(params.id) from exc

    def job_get(self, id: JobID) -> JobRow | None:
        """Return a job by ID, live or from history, or None."""
        return self._job_get(id)

    def job_logs(self, id: JobID) -> list[AttemptLog]:
        """Return the logs of a job's attempts, oldest first."""
        return self._job_logs(id)

    def job_list(self, params: JobListParams) -> list[JobRow]:
        """Return live and history jobs matching the filter, in ID order."""
        checks.job_list(params)
        if params.limit == 0:
            return []
        return self._job_list(params)

    def job_cancel(self, params: JobCancelParams) -> JobRow:
        """Cancel a job; return it as it is afterwards.

        A waiting job moves to history as canceled; a running job gets a cancel
        request (cancel_requested_at) and a control notification; a finalized
        job is returned unchanged. Raises NotFound for an unknown job.
        """
        got = self.job_cancel_many(JobCancelManyParams(ids=[params.id], now=params.now))
        if got.outcomes[params.id] == JobOutcome.FINISHED:
            found = self._job_get(params.id)
            if found is not None:
                return found
        return self._one(got, params.id)

    def job_retry(self, params: JobRetryParams) -> JobRow:
        """Make a job available now.

        A canceled or discarded (or completed) job moves back from history,
        with one more attempt allowed if it had run out; a waiting job has its
        schedule brought forward. Clears the TTL. Raises JobRunning for a
        running job, UniqueConflict if a live job holds the same unique key,
        NotFound for an unknown job. Keeps progress unless ``from_start``.
        Raises JobErased for an erased job: its arguments are gone.
        """
        many = JobRetryManyParams(ids=[params.id], from_start=params.from_start, now=params.now)
        return self._one(self.job_retry_many(many), params.id)

    def job_delete(self, params: JobDeleteParams) -> JobRow:
        """Remove a job that is not running; return it as last stored.

        Raises JobRunning for a running job, NotFound for an unknown one.
        """
        many = JobDeleteManyParams(ids=[params.id], now=params.now)
        return self._one(self.job_delete_many(many), params.id)

    def job_cancel_many(self, params: JobCancelManyParams) -> JobManyResult:
        """Cancel each job as ``job_cancel`` would, set-based: a statement per call.

        Unknown jobs are reported NOT_FOUND (not raised), finished ones
        FINISHED, so one bad ID never hides what happened to the rest.
        """
        ids = outcomes.unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        rows = self._job_cancel_many(dataclasses.replace(params, ids=ids))
        got = outcomes.many_result(ids, rows, outcomes.cancel_outcome)
        self._send(outcomes.cancel_notices(got.jobs))
        return got

    def job_retry_many(self, params: JobRetryManyParams) -> JobManyResult:
        """Retry each job as ``job_retry`` would; its errors become RUNNING,
        UNIQUE_CONFLICT, NOT_FOUND and ERASED outcomes, and those jobs are unchanged."""
        ids = outcomes.unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        erased = self._erased(ids)
        rest = [i for i in ids if i not in erased]
        rows = self._job_retry_many(dataclasses.replace(params, ids=rest)) if rest else None
        rows = rows or OperatorRows()
        rows.left.update(dict.fromkeys(erased, JobOutcome.ERASED))
        got = outcomes.many_result(ids, rows, lambda _: JobOutcome.RETRIED)
        self._send(outcomes.woken(got.jobs))
        return got

    def _erased(self, ids: Sequence[JobID]) -> set[JobID]:
        """Return which of these jobs were erased (an operator's read, before a retry)."""
        rows = self._job_list(JobListParams(ids=tuple(ids), limit=len(ids)))
        return {r.id for r in rows if r.erased_at is not None}

    def job_delete_many(self, params: JobDeleteManyParams) -> JobManyResult:
        """Delete each job as ``job_delete`` would; a running one is RUNNING, unchanged."""
        ids = outcomes.unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        rows = self._job_delete_many(dataclasses.replace(params, ids=ids))
        got = outcomes.many_result(ids, rows, lambda _: JobOutcome.DELETED)
        self._send(outcomes.delete_notices(got.jobs))
        return got

    def _one(self, got: JobManyResult, id: JobID) -> JobRow:
        """Return the one job a one-job operator method changed, or raise its refusal.

        Raised after the hook's atomic block has ended, so a caller's
        surrounding transaction stays usable.
        """
        error = outcomes.refusal(got.outcomes[id], id)
        if error is not None:
            raise error
        return got.jobs[0]

    def job_discard_expired(self, params: JobDiscardExpiredParams) -> list[JobRow]:
        """Move waiting jobs past their TTL to history as discarded."""
        if checks.limit(params.limit) == 0:
            return []
        jobs = self._job_discard_expired(params)
        self._send(outcomes.done(jobs))
        return jobs

    def job_rescue_candidates(self, params: JobRescueParams) -> list[RescueCandidate]:
        """Return running jobs whose client has no unexpired lease, plus (if
        ``stuck_after``) running jobs claimed longer ago than that; never a job
        under a job lease, which its lease governs (``job_expire_leases``), so
        that every candidate is one a finalize fenced to its claim can end."""
        if checks.limit(params.limit) == 0:
            return []
        return self._job_rescue_candidates(params)

    def job_retry_ordering_key(self, params: JobRetryOrderingKeyParams) -> int:
        """Wake an ordering key: up to ``limit`` of its scheduled or retryable jobs
        (oldest first, TTL not passed) become available now, keeping their TTL and
        losing their snooze reason; return how many. A running job of the key is
        marked (WAKE_MARKER) so that a snooze or retry of it is claimable at once.
        Pending and finalized jobs are left alone."""
        params = dataclasses.replace(
            params,
            queue=validation.queue_name(params.queue),
            ordering_key=checks.ordering_key(params.ordering_key),
        )
        if checks.limit(params.limit) == 0:
            return 0
        woken = self._job_retry_ordering_key(params)
        if woken:
            self._send(outcomes.woken_queues([params.queue]))
        return woken

    def job_age(self, params: JobAgeParams) -> int:
        """Raise by one level (up to 100) the priority of the queue's jobs that have
        been claimable for longer than ``after``; return how many."""
        validation.queue_name(params.queue)
        validation.positive_duration(params.after, "after")
        return self._job_age(params)

    def jobs_maintain(self, params: JobsMaintainParams | None = None) -> JobsMaintainResult:
        """Vacuum / analyze the hot tables when they need it, never waiting for a lock."""
        return self._jobs_maintain(params)

    # == job leases and the step ledger ========================================

    def job_claim_by_id(self, params: JobClaimByIDParams) -> JobLeaseRow:
        """Claim a waiting job (available, scheduled or retryable, whatever its
        schedule) by ID under a job lease with a token the database generates.

        The job runs with no owning client, attempt and fence incremented. The
        queue's pause, the TTL and the ordering key apply; queue limits do not.
        Raises, first that applies: NotFound (neither live nor history),
        JobNotClaimable (in history), JobFenced (live at another fence),
        JobRunning (running at ``fence``), JobNotClaimable (pending, past its
        TTL, queue paused, or not its ordering key's head). Waits for the row
        if another transaction holds it, or, with ``no_wait``, raises JobLocked
        at once (on a single-writer engine: when another transaction writes).
        """
        checks.claim_by_id(params)
        try:
            claimed = self._job_claim_by_id(params)
        except JobLocked as exc:
            raise outcomes.locked(params.id) from exc
        if isinstance(claimed, str):
            raise outcomes.claim_by_id_refusal(claimed, params.id)
        if claimed.job.decode_error is not None:
            raise refuse_undecodable_lease(self, claimed.job, claimed.lease.token, params.now)
        return claimed

    def job_lease_renew(self, params: JobLeaseRenewParams) -> JobLeaseStatus:
        """Extend a job lease by its TTL from database now; report a cancel request.

        Raises JobFenced once the lease is no longer the job's. Succeeds until
        an expiry is applied, not only until ``expires_at``.
        """
        status = self._job_lease_renew(params)
        if status is None:
            raise outcomes.lease_lost(params.id)
        return status

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
        if checks.limit(params.limit) == 0:
            return []
        return self._job_expire_leases(params)

    def job_step_get(self, params: JobStepGetParams) -> JobStepRow | None:
        """Return a step's ledger row (None if never tried), as the claim that owns the job.

        A step boundary: renews the job's lease in the same transaction when
        the claim is a lease. Raises JobFenced if the claim no longer owns the job.
        """
        checks.step(params.step)
        owned, row = self._job_step_get(params)
        if not owned:
            raise outcomes.not_owned(params.id)
        return row

    def job_step_record(self, params: JobStepRecordParams) -> JobStepRow:
        """Record one try of a step, conditional on the claim still owning the job.

        Attempts grow by one; ``done`` stores the result (kept thereafter), an
        error is kept as ``last_error``. Renews the lease in the same
        transaction when the claim is a lease. Raises JobFenced, writing
        nothing, if the claim lost the job.
        """
        checks.step(params.step)
        row = self._job_step_record(params)
        if row is None:
            raise outcomes.not_owned(params.id)
        return row

    def job_steps_clear(self, params: JobStepsClearParams) -> int:
        """Drop a job's step ledger as the claim that owns it; return the rows dropped.

        Raises JobFenced, dropping nothing, if the claim lost the job (a stale
        pass must not empty the ledger of the pass that took the job over).
        """
        dropped = self._job_steps_clear(params)
        if dropped is None:
            raise outcomes.not_owned(params.id)
        return dropped

    def job_steps(self, id: JobID) -> list[JobStepRow]:
        """Return a job's step ledger in the order the steps were first tried (no fence)."""
        return self._job_steps(id)

    # == pass leases of resumable runs ==================================

    def job_pass_begin(self, params: JobPassBeginParams) -> JobPassBegun | None:
        """BEGIN a claimed pass, the commitment point: the caller runs its handler
        if and only if this returns a lease, and does not second-guess it.

        Holds only while the claim still owns the job, has not begun, and its
        lease (a client's claim: ``ttl`` from the claim) runs more than
        ``margin`` past database now. It stamps the begin, clears the run's
        admission misses and leaves the job owned by a pass lease of ``ttl``
        from now (a client's claim becomes one, keeping ``attempted_by``), which
        each step boundary renews and a later claim takes over once it expires.
        None: not begun, nothing written.
        """
        checks.pass_begin(params)
        return self._job_pass_begin(params)

    def job_pass_miss(self, params: JobPassMissParams) -> JobPassMissed | None:
        """Record an admission miss of a claim that did not begin, in one transaction.

        Counts the miss and ends the claim as :func:`rules.admission_miss_result`
        says: the attempt given back and a backoff, or the run discarded at
        ``max_misses``. None: the claim no longer owns the job, or had begun;
        nothing was written.
        """
        checks.pass_miss(params)
        with transaction.atomic(using=self.alias, savepoint=False):
            found = self._job_pass_miss(params)
            if found is None:
                return None
            job, misses = found
            result = rules.admission_miss_result(
                job,
                misses,
                params.max_misses,
                params.reason,
                params.lease_token,
                ahead=params.ahead,
            )
            applied = self.job_finalize_many(JobFinalizeParams(jobs=[result], now=params.now))
        if not applied:
            return None
        return JobPassMissed(misses=misses, failed=result.state != JobState.SCHEDULED)

    def job_pass_takeover_many(self, params: JobPassTakeoverParams) -> list[JobPassTaken]:
        """End up to ``limit`` expired pass leases (by database time, no grace), and
        those held by a worker whose own client lease expired, so that the claim
        that follows can take their runs over. A begun pass lease is one whatever
        its kind; a lease that never began is one only for ``kinds``.

        A pass that had begun is charged as a failed attempt; a claim that never
        began is an admission miss (:func:`rules.pass_takeover_result`). Rows
        another transaction holds are skipped. One transaction.
        """
        checks.pass_takeover(params)
        if params.limit == 0:
            return []
        with transaction.atomic(using=self.alias, savepoint=False):
            expired = self._job_pass_expired(params)
            if not expired:
                return []
            results = [
                rules.pass_takeover_result(job, token, began, misses, params.max_misses)
                for job, token, began, misses in expired
            ]
            applied = self.job_finalize_many(JobFinalizeParams(jobs=results, now=params.now))
        done = {f.id for f in applied}
        return [
            JobPassTaken(id=job.id, began=began, misses=misses, state=JobState(result.state))
            for (job, _token, began, misses), result in zip(expired, results, strict=True)
            if job.id in done
        ]

    def job_pass_get(self, id: JobID) -> JobPassRow | None:
        """Return what a live run's row says of its pass lease and admission misses
        (None: not a live job)."""
        found = self._job_pass_get_many([id])
        return found[0] if found else None

    def job_pass_get_many(self, params: JobPassGetManyParams) -> list[JobPassRow]:
        """Return the pass state of each of ``ids`` that is a live job, in one
        statement, in request order (an operator's page of runs)."""
        checks.pass_get_many(params)
        ids = outcomes.unique_ids(params.ids)
        if not ids:
            return []
        found = {row.id: row for row in self._job_pass_get_many(ids)}
        return [found[i] for i in ids if i in found]

    # == data subjects =========================================================

    def subject_erase(self, params: SubjectEraseParams) -> ErasureRow:
        """Remove a data subject's data from every job row that carries it, atomically.

        Live jobs of the subject end: they move to history as discarded with
        their data removed, so a running attempt is fenced (its later result,
        progress, step records and logs are refused as a stale claim's) and is
        asked to cancel. Jobs in history (every partition) keep their identity,
        state, counters and times and lose their arguments, metadata, tags,
        keys, errors, snooze reason, progress and output. Both are marked
        ``erased_at``, and their step ledgers, attempt logs and dependency
        results are deleted. One ``hopper_erasure`` row records when and how
        many rows, naming the subject by its SHA-256 digest only. The batches
        and workflows of the ended jobs are settled and their dependents
        promoted or failed in the same transaction.
        """
        subject = checks.subject(params.subject)
        digest = hashlib.sha256(subject.encode()).hexdigest()
        with transaction.atomic(using=self.alias):
            row = self._subject_erase(dataclasses.replace(params, subject=subject), digest)
            if row.ended:
                promoted = self.workflow_promote_ready(
                    WorkflowPromoteParams(depends_on=tuple(row.ended), now=params.now)
                )
                batches = sorted({*row.batches, *promoted.batches})
                if batches:
                    self.batch_settle(BatchSettleParams(ids=tuple(batches), now=params.now))
            if row.fenced:
                self.notify(
                    CHANNEL_CONTROL, [ControlMessage.cancel(i).payload() for i in row.fenced]
                )
        return row

    # == clients ===============================================================

    def client_register(self, params: ClientRegisterParams) -> int:
        checks.ttl(params.ttl)
        return self._client_register(params)

    def client_renew(self, params: ClientRenewParams) -> ClientRenewResult:
        checks.ttl(params.ttl)
        return self._client_renew(params)

    def client_delete(self, client_id: int) -> None:
        return self._client_delete(client_id)

    def client_prune_expired(self, now: dt.datetime | None = None) -> int:
        return self._client_prune_expired(now)

    def client_list(self) -> list[ClientRow]:
        return self._client_list()

    # == leader ================================================================

    def leader_attempt(self, params: LeaderParams) -> bool:
        """Take or renew the leader lease; True if the client leads afterwards."""
        checks.ttl(params.ttl)
        return self._leader_attempt(params)

    def leader_resign(self, client_id: int) -> None:
        """Give up leadership if held, and signal others to elect."""
        return self._leader_resign(client_id)

    def leader_get(self, now: dt.datetime | None = None) -> int | None:
        """Return the leader's client ID, or None if the lease is free or expired."""
        return self._leader_get(now)

    # == queues ================================================================

    def queue_ensure(self, names: Sequence[str], now: dt.datetime | None = None) -> None:
        checked = checks.queue_names(names)
        if checked:
            self._queue_ensure(checked, now)

    def queue_list(self) -> list[QueueRow]:
        return self._queue_list()

    def queue_get(self, name: str) -> QueueRow | None:
        """Return one queue's row, or None if it is unknown."""
        return self._queue_get(validation.queue_name(name, "name"))

    def queue_pause(self, name: str, now: dt.datetime | None = None) -> None:
        """Stop every client claiming from a queue (creating its row if missing),
        and signal them on CHANNEL_CONTROL."""
        queue = validation.queue_name(name, "name")
        self._queue_pause(queue, now)
        self.notify(CHANNEL_CONTROL, [ControlMessage.pause(queue).payload()])

    def queue_resume(self, name: str, now: dt.datetime | None = None) -> None:
        """Undo queue_pause (creating the row if missing), and signal the clients."""
        queue = validation.queue_name(name, "name")
        self._queue_resume(queue, now)
        self.notify(CHANNEL_CONTROL, [ControlMessage.resume(queue).payload()])

    def queue_set_limits(self, limits: QueueLimits, now: dt.datetime | None = None) -> QueueRow:
        """Set a queue's cluster-wide limits, creating the queue if needed; zero
        removes a limit. Resets the rate limit's bucket. Signals the clients."""
        checked = validate_limits(limits)
        row = self._queue_set_limits(checked, now)
        self.notify(
            CHANNEL_CONTROL, [ControlMessage.limits(checked.name, checked.limited).payload()]
        )
        return row

    def stats(self, now: dt.datetime | None = None) -> Stats:
        """Return queue depths and cluster state."""
        return self._stats(now)

    def stats_bounded(self, params: StatsBoundedParams) -> Stats:
        """Return what ``stats`` returns, at a cost that does not grow with the live jobs.

        Each queue's count of a state stops at ``params.limit``; a count that
        reached it is the limit and names its state in ``QueueStats.capped``
        (the true number is at least that). The queues, the oldest waiting
        job and the cluster are read exactly, each from the first entries of
        an index. For pages an operator reloads; ``stats`` stays the exact
        read that metrics take.
        """
        checks.stats_bounded(params)
        # One entry past the limit tells a count that stopped from an exact one.
        out = self._stats_bounded(params.limit + 1, params.now)
        for depths in out.queues.values():
            capped = tuple(
                state
                for state in ("available", "scheduled", "retryable", "running")
                if getattr(depths, state) > params.limit
            )
            for state in capped:
                setattr(depths, state, params.limit)
            depths.capped = capped
        return out

    # == batches ===============================================================

    def batch_insert(self, params: BatchInsertParams) -> JobID:
        """Create a batch expecting ``total`` jobs; return its ID."""
        checks.batch(params)
        return self._batch_insert(params)

    def batch_count_duplicates(self, params: BatchDuplicatesParams) -> BatchDuplicatesResult:
        """Count inputs of batches that an existing job duplicated toward their batches.

        Each input is counted as the job holding its key stands after the
        insert: a live job of no batch that is not running joins the input's
        batch (its end is then counted as any batch job's); a job in history
        counts now, failed if it was canceled or discarded; a running job, or
        a live job of another batch, counts now as done (a job reports its end
        to one batch, and a running attempt was claimed without this one).
        Returns what was joined and counted; the caller settles the batches.
        """
        checks.batch_duplicates(params)
        if not params.duplicates:
            return BatchDuplicatesResult()
        return self._batch_count_duplicates(params)

    def batch_settle(self, params: BatchSettleParams) -> BatchSettleResult:
        """Fold batches' recorded progress in, and complete those with no job left.

        Completing a batch inserts its callbacks in the same transaction, and
        only the transaction that completes it does, so callbacks fire once.
        """
        if params.ids is not None and not params.ids:
            return BatchSettleResult()
        checks.limit(params.limit)
        return self._batch_settle(params)

    def batch_get(self, id: JobID) -> BatchRow | None:
        """Return a batch's progress (folded), or None."""
        return self._batch_get(id)

    # == workflows =============================================================

    def workflow_insert(self, params: WorkflowInsertParams) -> WorkflowInsertResult:
        """Insert a workflow's batch, jobs and edges atomically; jobs with dependencies
        start pending. Refuse an invalid workflow before writing anything."""
        checks.workflow(params)
        result = self._workflow_insert(params)
        if params.notify:
            self._send(outcomes.woken([r.job for r in result.jobs]))
        return result

    def workflow_get(self, id: JobID) -> WorkflowRow | None:
        """Return a workflow's batch, jobs (live and history), edges and step names."""
        return self._workflow_get(id)

    def workflow_promote_ready(self, params: WorkflowPromoteParams) -> WorkflowPromoteResult:
        """Promote pending jobs whose dependencies have all finalized, or fail them
        (cancel or discard, following the edge's on_failure) when one failed; the
        failure cascades down the graph within the call."""
        if params.depends_on is not None and not params.depends_on:
            return WorkflowPromoteResult()
        checks.positive_limit(params.limit)
        return self._workflow_promote_ready(params)

    # == periodic jobs =========================================================

    def periodic_insert(self, params: PeriodicInsertParams) -> tuple[JobRow | None, bool]:
        """Insert the job of a slot unless that slot (or a later one) was inserted.

        Atomic: of two leaders inserting the same slot, one inserts and the
        other gets ``(None, False)``; a slot produces at most one job. Returns
        the job and True when inserted; ``(existing, False)`` when the job was a
        unique-key duplicate (the slot is still recorded).
        """
        return self._periodic_insert(params)

    def periodic_last_slots(self) -> dict[str, dt.datetime]:
        """Return the last inserted slot per periodic job name."""
        return self._periodic_last_slots()

    def periodic_register(self, params: PeriodicRegisterParams) -> None:
        """Replace a client's registrations atomically.

        Records none for a client whose lease expired or whose row is gone, and
        deletes the registrations of clients whose row is gone.
        """
        return self._periodic_register(params)

    def periodic_registrations(
        self, now: dt.datetime | None = None
    ) -> list[PeriodicRegistrationRow]:
        """Return the registrations of clients whose lease has not expired."""
        return self._periodic_registrations(now)

    def periodic_list(self) -> list[PeriodicSlotRow]:
        """Return every periodic job's recorded state (last slot, disabled), by name."""
        return self._periodic_list()

    def periodic_disable(self, params: PeriodicDisableParams) -> PeriodicSlotRow:
        """Stop inserting a periodic job's slots until it is enabled.

        Works for a name with no slot yet (its state row is created). Disabling
        a disabled job keeps its first ``disabled_at``. A slot the leader is
        inserting at that moment serializes on the row: it is inserted before
        the disable or not at all.
        """
        checks.route_control(params)
        return self._periodic_disable(params)

    def periodic_enable(self, params: PeriodicEnableParams) -> PeriodicSlotRow:
        """Insert a disabled periodic job's slots again, from the next one on time.

        The slots that fell while it was disabled are skipped, never caught
        up (``enabled_at`` settles them). Enabling an enabled job changes
        nothing.
        """
        checks.route_control(params)
        return self._periodic_enable(params)

    def periodic_run_now(self, params: PeriodicRunNowParams) -> PeriodicRunNowResult:
        """Run a periodic job now, one job per slot whoever inserts it.

        With ``params.slot`` (a slot due now, not yet inserted), the run *is*
        that slot's job, recorded as the leader records one: if the leader's
        tick inserted it first, that job is returned (``inserted=False``) and
        nothing else is inserted. Otherwise (or if the job was disabled in
        between) ``params.extra`` is inserted: a run outside the schedule that
        leaves the slots alone; its unique key makes a second click while it
        waits return the first run (``inserted=False``).
        """
        checks.periodic_run_now(params)
        if params.slot is not None:
            job, inserted = self._periodic_insert(
                PeriodicInsertParams(
                    name=params.name, slot=params.slot, job=params.job, now=params.now
                )
            )
            if job is not None:
                return PeriodicRunNowResult(job=job, slot=params.slot, inserted=inserted)
            state = next((r for r in self._periodic_list() if r.name == params.name), None)
            if (
                state is not None
                and state.disabled_at is None
                and state.last_slot is not None
                and state.last_slot >= params.slot
                and state.job_id is not None
            ):
                existing = self._job_get(state.job_id)
                if existing is not None:
                    return PeriodicRunNowResult(job=existing, slot=state.last_slot, inserted=False)
        (result,) = self.job_insert_many([params.extra], JobInsertOpts(notify=True, now=params.now))
        return PeriodicRunNowResult(job=result.job, slot=None, inserted=not result.duplicate)

    # == history ===============================================================

    def history_maintain(self, params: HistoryMaintainParams) -> HistoryMaintainResult:
        """Enforce retention on history and prepare storage ahead; idempotent."""
        return self._history_maintain(params)

    def history_partitions(self) -> list[HistoryPartitionRow]:
        """List history's storage units: its partitions, or the one table with its row count."""
        return self._history_partitions()

    def history_index(self, params: HistoryIndexParams) -> HistoryIndexResult:
        """Build indexes declared on history for partitions that lack them, and
        repair the invalid indexes interrupted concurrent builds left on hopper's
        tables.

        Runs outside any transaction (concurrent builds); idempotent. Engines
        without concurrent builds (``supports_concurrent_index_builds``) have
        nothing to build or repair. A repair that fails does not stop the pass:
        once the rest is done, ``HistoryIndexRepairError`` reports it, carrying
        the pass's result.
        """
        checks.history_index(params)
        if not self.features.supports_concurrent_index_builds:
            return HistoryIndexResult()
        result = self._history_index(params)
        if result.repair_errors:
            names = ", ".join(sorted(result.repair_errors))
            raise HistoryIndexRepairError(
                f"history_index: repairing {names} failed: "
                + "; ".join(f"{k}: {v}" for k, v in sorted(result.repair_errors.items())),
                result=result,
                failures=dict(result.repair_errors),
            )
        return result

    def history_index_declare(self, params: HistoryIndexDeclareParams) -> None:
        """Declare an index of partitioned history on its parent only, or drop one.

        ``CREATE INDEX IF NOT EXISTS ... ON ONLY`` (a catalog change; the
        ``HistoryIndexer`` builds each partition's copy concurrently), or
        ``DROP INDEX`` of the parent together with every partition's copy of it
        that a pass built and had not attached. Either first waits for the
        history index builder's lock, which a pass holds from its listing to
        its last build: a pass never builds a copy of a parent being dropped,
        nor lists parents that are changing, so a migration and the leader
        converge on one valid copy per partition. Runs in a transaction (the
        caller's, if any), which holds the lock to its end. Where history is
        one table, nothing: migrations build its indexes.
        """
        checks.index_name(params.name)
        if not self.features.supports_history_partitions:
            return
        self._history_index_declare(params)

    # == notifications =========================================================

    def notify(self, channel: str, payloads: Sequence[str]) -> None:
        """Send notifications, delivered when the surrounding transaction
        commits. Engines without notifications do nothing."""
        checks.channel(channel)
        if payloads and self.features.supports_listen:
            self._notify(channel, payloads)

    def _send(self, notices: Sequence[outcomes.Notice]) -> None:
        """Send the notifications the front decided on (:mod:`.outcomes`)."""
        for channel, payloads in notices:
            self.notify(channel, payloads)

    # == pub/sub ===============================================================

    def subscription_upsert(
        self, rows: Sequence[SubscriptionRow], now: dt.datetime | None = None
    ) -> None:
        """Record subscriptions, updating pattern, kind, queue and settings by name."""
        checked = {r.name: r for r in (topics.check_subscription(r) for r in rows)}
        if checked:
            self._subscription_upsert(list(checked.values()), now)

    def subscription_list(self) -> list[SubscriptionRow]:
        """Return every subscription, by name."""
        return self._subscription_list()

    def subscription_pause(self, params: SubscriptionPauseParams) -> SubscriptionRow:
        """Hold a subscription's deliveries until it is resumed; lose none.

        A publish while it is paused still inserts its delivery, held: in the
        scheduled state at ``HELD_AT``, which nothing promotes. Deliveries
        made before the pause run as usual (pause their queue to stop those).
        Pausing a paused subscription keeps its first ``paused_at``; a
        worker re-declaring it never resumes it. Raises NotFound.
        """
        name = checks.route_control(params)
        row = self._subscription_pause(params)
        if row is None:
            raise outcomes.no_subscription(name)
        return row

    def subscription_resume(self, params: SubscriptionResumeParams) -> SubscriptionResumeResult:
        """Deliver again, and release the deliveries held while paused: they are due
        now, and the workers of their queues are woken at commit. Raises NotFound."""
        name = checks.route_control(params)
        result = self._subscription_resume(params)
        if result is None:
            raise outcomes.no_subscription(name)
        self.notify(CHANNEL_INSERT, result.queues)
        return result

    def subscription_delete(self, params: SubscriptionDeleteParams) -> RouteDeleteResult:
        """Delete a subscription: later publishes make no delivery for it.

        Its deliveries already made are jobs, accepted for delivery: they
        still run, and those held by a pause are released (at-least-once is
        never broken silently). With ``cancel_pending`` every one of them that
        is not running (waiting, scheduled, retrying or held) is canceled
        instead, in the same transaction, as ``job_cancel_many`` cancels;
        running ones finish. Raises NotFound, and then changes nothing.
        """
        name = checks.route_delete(params)
        result: RouteDeleteResult | None = None
        # NotFound is raised after the block, so that a caller's transaction is
        # not marked for rollback by a refusal that wrote nothing.
        with transaction.atomic(using=self.alias, savepoint=False):
            released = None
            if not params.cancel_pending:
                released = self._subscription_resume(
                    SubscriptionResumeParams(name=name, now=params.now)
                )
            route = None
            if params.cancel_pending or released is not None:
                route = self._subscription_delete(params)
            if route is not None:
                result = RouteDeleteResult(route=route)
                if released is not None:
                    result.released, result.queues = released.released, released.queues
                else:
                    self._cancel_deliveries(self._subscription_waiting(name), params.now, result)
        if result is None:
            raise outcomes.no_subscription(name)
        self.notify(CHANNEL_INSERT, result.queues)
        return result

    def _cancel_deliveries(
        self, ids: list[JobID], now: dt.datetime | None, result: RouteDeleteResult
    ) -> None:
        """Cancel waiting deliveries in chunks, one statement each; count them into result."""
        for start in range(0, len(ids), CANCEL_CHUNK):
            chunk = ids[start : start + CANCEL_CHUNK]
            done = self.job_cancel_many(JobCancelManyParams(ids=chunk, now=now))
            ended = [j for j in done.jobs if j.state == JobState.CANCELED]
            result.canceled += len(ended)
            result.ended.extend(ended)

    def message_publish(self, params: MessagePublishParams) -> list[JobInsertResult]:
        """Insert one delivery per subscription whose pattern matches the topic, in
        one insert statement of the caller's transaction; return them in
        subscription-name order. A delivery whose dedup key matches a live one is
        returned as a duplicate.

        The subscriptions are read and matched in Python here, once for both
        engines; the read and the insert share one transaction (the caller's,
        if any), so the deliveries commit or roll back with whatever the
        caller writes.
        """
        params = topics.check_publish(params)
        with transaction.atomic(using=self.alias, savepoint=False):
            subs, db_now = self._message_subscriptions(params.now)
            scheduled_at = db_now + params.delay if params.delay else None
            deliveries = topics.publish_deliveries(
                subs, params, params.message_id or new_id().hex, scheduled_at
            )
            if not deliveries:
                return []
            return self.job_insert_many(
                deliveries, JobInsertOpts(notify=params.notify, now=params.now)
            )

    # == streams ===============================================================

    def stream_append(self, params: StreamAppendParams) -> StreamEvent:
        """Append one event and return it with its position."""
        return self._stream_append(topics.check_append(params))

    def stream_read(self, params: StreamReadParams) -> list[StreamEvent]:
        """Page through committed events after a position whose topic matches, in
        position order. For browsing: a consumer is what never misses a late commit."""
        params = topics.check_read(params)
        if params.limit == 0:
            return []
        return self._stream_read(params)

    def stream_consumer_upsert(
        self, rows: Sequence[StreamConsumerRow], now: dt.datetime | None = None
    ) -> None:
        """Record consumers, updating pattern, kind, queue and settings by name; a
        new consumer starts at its ``start``; an existing one keeps its position."""
        checked = {r.name: r for r in (topics.check_consumer(r) for r in rows)}
        if checked:
            self._stream_consumer_upsert(list(checked.values()), now)

    def stream_consumer_list(self) -> list[StreamConsumerRow]:
        """Return every consumer with its position, by name."""
        return self._stream_consumer_list()

    def stream_consumer_pause(self, params: StreamConsumerPauseParams) -> StreamConsumerRow:
        """Stop pumping a consumer: no pump that starts after this commits delivers
        for it, and its events wait in the log at its position (retention still
        applies). Deliveries made before keep running. Pausing a paused
        consumer keeps its first ``paused_at``. Raises NotFound."""
        name = checks.route_control(params)
        row = self._stream_consumer_pause(params)
        if row is None:
            raise outcomes.no_consumer(name)
        return row

    def stream_consumer_resume(self, params: StreamConsumerResumeParams) -> StreamConsumerRow:
        """Pump a paused consumer again, from where it stopped. Raises NotFound."""
        name = checks.route_control(params)
        row = self._stream_consumer_resume(params)
        if row is None:
            raise outcomes.no_consumer(name)
        return row

    def stream_consumer_reset(self, params: StreamConsumerResetParams) -> StreamConsumerRow:
        """Move a consumer back to its ``start``, as if it were created now:
        ``earliest`` replays every retained event, ``latest`` skips what is
        appended so far. Keeps it paused or not. Raises NotFound."""
        name = checks.route_control(params)
        row = next((r for r in self._stream_consumer_list() if r.name == name), None)
        if row is None:
            raise outcomes.no_consumer(name)
        earliest = row.start == StreamStart.EARLIEST
        mode = StreamStart.EARLIEST if earliest else StreamStart.LATEST
        seek = StreamSeekParams(earliest=earliest, latest=not earliest)
        moved = self._stream_consumer_seek(name, seek, mode)
        if moved is None:
            raise outcomes.no_consumer(name)
        return moved

    def stream_consumer_delete(self, params: StreamConsumerDeleteParams) -> RouteDeleteResult:
        """Delete a consumer and its position; its events stay in the log for the others.

        Deliveries already made still run; with ``cancel_pending`` those not
        running are canceled in the same transaction, as for
        ``subscription_delete``. Re-declaring the consumer later creates it
        anew at its ``start``. Raises NotFound, and then changes nothing.
        """
        name = checks.route_delete(params)
        result: RouteDeleteResult | None = None
        with transaction.atomic(using=self.alias, savepoint=False):
            route = self._stream_consumer_delete(params)
            if route is not None:
                result = RouteDeleteResult(route=route)
                if params.cancel_pending:
                    self._cancel_deliveries(self._stream_consumer_waiting(name), params.now, result)
        if result is None:
            raise outcomes.no_consumer(name)
        return result

    def stream_consumer_lag(self, params: StreamConsumerLagParams) -> list[StreamConsumerLag]:
        """Return how far behind each consumer is, by name.

        Each count reads a window of the consumer's first ``limit`` waiting
        events (what a pump would read next, whatever their topic) and counts
        those its pattern matches, with when the first of them was appended.
        When more events wait than the window holds, ``capped`` says the count
        is a lower bound. One statement whatever the number of consumers, and
        each reads at most ``limit`` events, so the cost does not grow with
        the log.
        """
        checks.consumer_lag(params)
        wanted = set(params.names)
        consumers = [c for c in self._stream_consumer_list() if not wanted or c.name in wanted]
        if not consumers:
            return []
        # One event past the limit tells a full window from an exact count.
        counted = self._stream_consumer_lag(consumers, params.limit + 1)
        return [
            StreamConsumerLag(
                name=c.name,
                events=min(c.events, params.limit),
                capped=c.capped,
                oldest_at=c.oldest_at,
            )
            for c in counted
        ]

    def stream_consumer_seek(self, name: str, params: StreamSeekParams) -> StreamConsumerRow:
        """Move a consumer: events after the new position are delivered (again).
        Raises NotFound for an unknown consumer."""
        row = self._stream_consumer_seek(name, params, topics.check_seek(params))
        if row is None:
            raise outcomes.no_consumer(name)
        return row

    def stream_pump(
        self, name: str, limit: int, now: dt.datetime | None = None
    ) -> StreamPumpResult:
        """Turn up to ``limit`` events after a consumer's position into delivery jobs
        and advance the position, atomically; two pumps of one consumer serialize on
        its row. Never skips an event whose transaction commits late. Raises NotFound
        for an unknown consumer."""
        topics.check_limit(limit)
        pumped = self._stream_pump(name, limit, now)
        if pumped is None:
            raise outcomes.no_consumer(name)
        return pumped

    def stream_prune(self, params: StreamPruneParams) -> int:
        """Delete up to ``limit`` events older than the retention; return how many."""
        topics.check_limit(params.limit)
        retention = params.retention
        if not isinstance(retention, dt.timedelta) or retention < dt.timedelta(0):
            raise InvalidJob(
                f"retention must be a non-negative timedelta, not {retention!r}",
                field="retention",
            )
        return self._stream_prune(params)

    # == vendor hooks: run the SQL, convert the rows ====================

    # -- jobs

    @abstractmethod
    def _job_insert_many(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = JobInsertOpts()
    ) -> list[JobInsertResult]: ...

    @abstractmethod
    def _job_insert_copy(
        self, params: Sequence[JobInsertParams], opts: JobInsertOpts = JobInsertOpts()
    ) -> list[JobInsertResult]: ...

    @abstractmethod
    def _job_claim(self, params: JobClaimParams) -> JobClaimResult:
        """Claim through the unlimited path: one statement, no queue row lock."""

    @abstractmethod
    def _job_claim_keyless(self, params: JobClaimParams) -> JobClaimResult | None:
        """Claim through the unlimited path without ordering keys; None, having
        claimed nothing, when the queue has a keyed candidate (available,
        scheduled or retryable with an ordering key)."""

    @abstractmethod
    def _job_claim_limited(self, params: JobClaimParams) -> JobClaimResult:
        """Claim through the limited path: lock the queue row, plan with engine.limits."""

    @abstractmethod
    def _job_return_many(self, params: JobReturnManyParams) -> list[tuple[JobID, str]]:
        """Return the claimed-ahead jobs in one statement; report (ID, queue) of each returned."""

    @abstractmethod
    def _job_schedule(self, params: JobScheduleParams) -> tuple[int, list[str]]:
        """Promote the due jobs; return how many, and the queues that got them."""

    @abstractmethod
    def _job_finalize_many(self, params: JobFinalizeParams) -> list[JobFinalized]: ...

    @abstractmethod
    def _job_record_progress(self, params: JobRecordProgressParams) -> Progress | None: ...

    @abstractmethod
    def _job_get(self, id: JobID) -> JobRow | None: ...

    @abstractmethod
    def _job_logs(self, id: JobID) -> list[AttemptLog]: ...

    @abstractmethod
    def _job_list(self, params: JobListParams) -> list[JobRow]: ...

    @abstractmethod
    def _job_cancel_many(self, params: JobCancelManyParams) -> OperatorRows:
        """Decide each job (IDs unique) in one atomic block; send nothing, raise nothing."""

    @abstractmethod
    def _job_retry_many(self, params: JobRetryManyParams) -> OperatorRows:
        """Decide each job (IDs unique) in one atomic block; send nothing, raise nothing."""

    @abstractmethod
    def _job_delete_many(self, params: JobDeleteManyParams) -> OperatorRows:
        """Decide each job (IDs unique) in one atomic block; send nothing, raise nothing."""

    @abstractmethod
    def _job_discard_expired(self, params: JobDiscardExpiredParams) -> list[JobRow]: ...

    @abstractmethod
    def _job_rescue_candidates(self, params: JobRescueParams) -> list[RescueCandidate]: ...

    @abstractmethod
    def _job_retry_ordering_key(self, params: JobRetryOrderingKeyParams) -> int: ...

    @abstractmethod
    def _job_age(self, params: JobAgeParams) -> int: ...

    @abstractmethod
    def _jobs_maintain(self, params: JobsMaintainParams | None = None) -> JobsMaintainResult: ...

    # -- job leases and the step ledger

    @abstractmethod
    def _job_claim_by_id(self, params: JobClaimByIDParams) -> JobLeaseRow | str:
        """Claim the job, or return the refusal's status (``outcomes.claim_by_id_refusal``);
        a claimed job whose values do not decode comes back as claimed, for the front to end."""

    @abstractmethod
    def _job_lease_renew(self, params: JobLeaseRenewParams) -> JobLeaseStatus | None:
        """Extend the lease; None once it is no longer the job's."""

    @abstractmethod
    def _job_expire_leases(self, params: JobExpireLeasesParams) -> list[JobRow]: ...

    @abstractmethod
    def _job_step_get(self, params: JobStepGetParams) -> tuple[bool, JobStepRow | None]:
        """Return whether the claim owns the job, and the step's row (None if never tried)."""

    @abstractmethod
    def _job_step_record(self, params: JobStepRecordParams) -> JobStepRow | None:
        """Record the try and return the row; None, writing nothing, if the claim lost the job."""

    @abstractmethod
    def _job_steps_clear(self, params: JobStepsClearParams) -> int | None:
        """Return the rows dropped; None, dropping nothing, if the claim lost the job."""

    @abstractmethod
    def _job_steps(self, id: JobID) -> list[JobStepRow]: ...

    # -- pass leases of resumable runs

    @abstractmethod
    def _job_pass_begin(self, params: JobPassBeginParams) -> JobPassBegun | None: ...

    @abstractmethod
    def _job_pass_miss(self, params: JobPassMissParams) -> tuple[JobRow, int] | None:
        """Count the miss on the claim's row (not begun); return the job and the new count."""

    @abstractmethod
    def _job_pass_expired(
        self, params: JobPassTakeoverParams
    ) -> list[tuple[JobRow, JobID, bool, int]]:
        """Lock the expired pass leases (SKIP LOCKED), count a miss on those never
        begun; return each job with its lease token, whether it began, and its misses."""

    @abstractmethod
    def _job_pass_get_many(self, ids: list[JobID]) -> list[JobPassRow]: ...

    # -- data subjects

    @abstractmethod
    def _subject_erase(self, params: SubjectEraseParams, digest: str) -> ErasureRow:
        """Erase the subject's rows; record the erasure under ``digest``."""

    # -- clients

    @abstractmethod
    def _client_register(self, params: ClientRegisterParams) -> int: ...

    @abstractmethod
    def _client_renew(self, params: ClientRenewParams) -> ClientRenewResult: ...

    @abstractmethod
    def _client_delete(self, client_id: int) -> None: ...

    @abstractmethod
    def _client_prune_expired(self, now: dt.datetime | None = None) -> int: ...

    @abstractmethod
    def _client_list(self) -> list[ClientRow]: ...

    # -- leader

    @abstractmethod
    def _leader_attempt(self, params: LeaderParams) -> bool: ...

    @abstractmethod
    def _leader_resign(self, client_id: int) -> None: ...

    @abstractmethod
    def _leader_get(self, now: dt.datetime | None = None) -> int | None: ...

    # -- queues

    @abstractmethod
    def _queue_ensure(self, names: list[str], now: dt.datetime | None = None) -> None: ...

    @abstractmethod
    def _queue_list(self) -> list[QueueRow]: ...

    @abstractmethod
    def _queue_get(self, name: str) -> QueueRow | None: ...

    @abstractmethod
    def _queue_pause(self, name: str, now: dt.datetime | None = None) -> None: ...

    @abstractmethod
    def _queue_resume(self, name: str, now: dt.datetime | None = None) -> None: ...

    @abstractmethod
    def _queue_set_limits(
        self, limits: QueueLimits, now: dt.datetime | None = None
    ) -> QueueRow: ...

    @abstractmethod
    def _stats(self, now: dt.datetime | None = None) -> Stats: ...

    @abstractmethod
    def _stats_bounded(self, window: int, now: dt.datetime | None = None) -> Stats: ...

    # -- batches

    @abstractmethod
    def _batch_insert(self, params: BatchInsertParams) -> JobID: ...

    @abstractmethod
    def _batch_count_duplicates(self, params: BatchDuplicatesParams) -> BatchDuplicatesResult: ...

    @abstractmethod
    def _batch_settle(self, params: BatchSettleParams) -> BatchSettleResult: ...

    @abstractmethod
    def _batch_get(self, id: JobID) -> BatchRow | None: ...

    # -- workflows

    @abstractmethod
    def _workflow_insert(self, params: WorkflowInsertParams) -> WorkflowInsertResult: ...

    @abstractmethod
    def _workflow_get(self, id: JobID) -> WorkflowRow | None: ...

    @abstractmethod
    def _workflow_promote_ready(self, params: WorkflowPromoteParams) -> WorkflowPromoteResult: ...

    # -- periodic jobs

    @abstractmethod
    def _periodic_insert(self, params: PeriodicInsertParams) -> tuple[JobRow | None, bool]: ...

    @abstractmethod
    def _periodic_last_slots(self) -> dict[str, dt.datetime]: ...

    @abstractmethod
    def _periodic_register(self, params: PeriodicRegisterParams) -> None: ...

    @abstractmethod
    def _periodic_registrations(
        self, now: dt.datetime | None = None
    ) -> list[PeriodicRegistrationRow]: ...

    @abstractmethod
    def _periodic_list(self) -> list[PeriodicSlotRow]: ...

    @abstractmethod
    def _periodic_disable(self, params: PeriodicDisableParams) -> PeriodicSlotRow: ...

    @abstractmethod
    def _periodic_enable(self, params: PeriodicEnableParams) -> PeriodicSlotRow: ...

    # -- schema

    @abstractmethod
    def _schema_state(self) -> SchemaState: ...

    @abstractmethod
    def _index_valid(self, name: str) -> bool | None: ...

    @abstractmethod
    def _schema_lock_open(self) -> Any:
        """Open the dedicated connection the lock lives on (None: nothing to lock)."""

    @abstractmethod
    def _schema_lock_try(self, handle: Any) -> bool:
        """Try to take the lock without waiting; True if it is now held."""

    @abstractmethod
    def _schema_lock_holder(self, handle: Any) -> str:
        """Describe who holds the lock, for the waiting message."""

    @abstractmethod
    def _schema_lock_close(self, handle: Any) -> None:
        """Release the lock (if held) and close its connection."""

    # -- history

    @abstractmethod
    def _history_maintain(self, params: HistoryMaintainParams) -> HistoryMaintainResult: ...

    @abstractmethod
    def _history_partitions(self) -> list[HistoryPartitionRow]: ...

    @abstractmethod
    def _history_index(self, params: HistoryIndexParams) -> HistoryIndexResult: ...

    @abstractmethod
    def _history_index_declare(self, params: HistoryIndexDeclareParams) -> None: ...

    # -- notifications

    @abstractmethod
    def _notify(self, channel: str, payloads: Sequence[str]) -> None: ...

    # -- pub/sub

    @abstractmethod
    def _subscription_upsert(
        self, rows: Sequence[SubscriptionRow], now: dt.datetime | None = None
    ) -> None: ...

    @abstractmethod
    def _subscription_list(self) -> list[SubscriptionRow]: ...

    @abstractmethod
    def _message_subscriptions(
        self, now: dt.datetime | None
    ) -> tuple[list[SubscriptionRow], dt.datetime]:
        """Return every subscription a publish matches against, and the database
        time (``now`` if given) its deliveries are scheduled from."""

    @abstractmethod
    def _subscription_pause(self, params: SubscriptionPauseParams) -> SubscriptionRow | None:
        """Set paused_at (kept if set); return the row, or None if unknown."""

    @abstractmethod
    def _subscription_resume(
        self, params: SubscriptionResumeParams
    ) -> SubscriptionResumeResult | None:
        """Clear paused_at and make the subscription's held deliveries due now."""

    @abstractmethod
    def _subscription_delete(self, params: SubscriptionDeleteParams) -> SubscriptionRow | None:
        """Delete the row; return it as it was, or None if unknown."""

    @abstractmethod
    def _subscription_waiting(self, name: str) -> list[JobID]:
        """Return the IDs of the subscription's live deliveries that are not running."""

    # -- streams

    @abstractmethod
    def _stream_append(self, params: StreamAppendParams) -> StreamEvent: ...

    @abstractmethod
    def _stream_read(self, params: StreamReadParams) -> list[StreamEvent]: ...

    @abstractmethod
    def _stream_consumer_upsert(
        self, rows: Sequence[StreamConsumerRow], now: dt.datetime | None = None
    ) -> None: ...

    @abstractmethod
    def _stream_consumer_list(self) -> list[StreamConsumerRow]: ...

    @abstractmethod
    def _stream_consumer_seek(
        self, name: str, params: StreamSeekParams, mode: str
    ) -> StreamConsumerRow | None:
        """Move the consumer; None if there is none of that name."""

    @abstractmethod
    def _stream_pump(
        self, name: str, limit: int, now: dt.datetime | None = None
    ) -> StreamPumpResult | None:
        """Pump the consumer; None if there is none of that name."""

    @abstractmethod
    def _stream_prune(self, params: StreamPruneParams) -> int: ...

    @abstractmethod
    def _stream_consumer_pause(self, params: StreamConsumerPauseParams) -> StreamConsumerRow | None:
        """Set paused_at (kept if set); return the row, or None if unknown."""

    @abstractmethod
    def _stream_consumer_resume(
        self, params: StreamConsumerResumeParams
    ) -> StreamConsumerRow | None:
        """Clear paused_at; return the row, or None if unknown."""

    @abstractmethod
    def _stream_consumer_delete(
        self, params: StreamConsumerDeleteParams
    ) -> StreamConsumerRow | None:
        """Delete the row; return it as it was, or None if unknown."""

    @abstractmethod
    def _stream_consumer_waiting(self, name: str) -> list[JobID]:
        """Return the IDs of the consumer's live deliveries that are not running."""

    @abstractmethod
    def _stream_consumer_lag(
        self, consumers: Sequence[StreamConsumerRow], window: int
    ) -> list[StreamConsumerLag]:
        """Read each consumer's first ``window`` waiting events; count those that match
        (``capped``: the window was full), by name."""
