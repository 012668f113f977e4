"""Job leases: take one job by ID, work on it outside a worker, and finalize it
inside your own transaction.

A job leased by ID runs with no worker: a lease (a random token the database
makes, and the claim's fence) owns it until the lease expires or the attempt
ends, and every write the holder makes (progress, the result) is fenced to
that lease. A web request can take a job, do the job's work and finalize it
atomically with its own rows::

    from django.db import transaction
    import django_hopper as hopper

    with transaction.atomic():
        with hopper.lease_job(job_id, nowait=True) as lease:
            invoice = Invoice.objects.create(order_id=lease.job.args["kwargs"]["order_id"])
            lease.complete({"invoice": invoice.pk})

The rules (docs/job-leases.md has the long form):

* Inside a transaction, the claim, the body and the outcome are one savepoint:
  an exception rolls all three back (the job is exactly as it was, no attempt
  charged) and propagates, and a rollback of the caller's transaction does the
  same. Until it commits, no worker can see the job as claimed, and a worker's
  claim skips the row (PostgreSQL) or waits for the write lock (SQLite).
* Outside a transaction the claim commits at once: the lease is durable, the
  holder renews it (:meth:`JobLease.renew`), and if it stops renewing the
  leader's lease expirer ends the attempt once the lease is due (retryable at
  once, discarded on the last attempt, canceled on request), with a grace
  after an outage. A holder that then reports an outcome gets
  :class:`~django_hopper.exceptions.JobFenced` and nothing is written, so of
  the holder and a worker that took the job over, exactly one finalizes it.
* The body's exit decides the attempt when it did not: an ``Exception`` fails
  it (retry after backoff, or discarded on the last attempt),
  :class:`~django_hopper.exceptions.JobCanceled` cancels it, and a clean exit,
  or any other ``BaseException`` (a server stopping), releases the job: it is
  waiting again at once and the attempt is given back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, overload

from django.db import transaction

from django_hopper import registry as job_registry
from django_hopper import signals, validation
from django_hopper.api import _find, parse_job_id
from django_hopper.conf import hopper_settings
from django_hopper.context import JobSnooze
from django_hopper.engine.params import (
    JobClaimByIDParams,
    JobFinalize,
    JobFinalizeParams,
    JobLeaseRenewParams,
    JobRecordProgressParams,
)
from django_hopper.exceptions import (
    HopperError,
    InvalidJob,
    JobCanceled,
    JobFenced,
    JobLocked,
    NotFound,
)
from django_hopper.runs import ProgressNotResumable, read_progress
from django_hopper.types import FINAL_STATES, JobState, LeaseFence
from django_hopper.worker.completer import settle_finished
from django_hopper.worker.execution import canceled, completed, failed, snoozed

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.jobs import JobFunction
    from django_hopper.types import JSON, JobID, JobRow, Progress

__all__ = ["DEFAULT_LEASE", "MIN_LEASE", "JobLease", "claim_job", "lease_job", "resume_lease"]

logger = logging.getLogger("django_hopper.leases")

#: The lease a job taken by ID holds when the caller names none.
DEFAULT_LEASE = dt.timedelta(seconds=30)
#: The shortest lease accepted, the floor a resumable pass's lease has too:
#: below it a lease can lapse between the claim and the first statement of
#: the work, and no renewal could keep it.
MIN_LEASE = validation.PASS_LEASE_MIN
#: The reason stored on a job whose holder handed it back without an outcome.
RELEASED_REASON = "released by its lease holder"
#: How often a claim re-reads a job whose fence moved under it (another claim
#: took it and ended) before it reports the job as taken.
_FENCE_RETRIES = 3


def _lease_ttl(value: Any) -> dt.timedelta:
    """Return the lease duration (numbers are seconds), at least MIN_LEASE."""
    ttl = validation.positive_duration(value, "lease")
    if ttl < MIN_LEASE:
        raise InvalidJob(
            f"lease must be at least {MIN_LEASE.total_seconds():g} second, not {ttl!r}",
            field="lease",
        )
    return ttl


def _job_function(kind: str) -> JobFunction[Any, Any] | None:
    """Return the job function of ``kind`` if this process registered it (for its
    archive option); importing job modules is a worker's business, not a request's."""
    return job_registry.registry.get(kind)


def _is_resumable_run(job: JobRow) -> bool:
    """Return whether ``job`` is a resumable run: a kind registered here as one, or
    progress that is a committed pass's (a request rarely imports job modules)."""
    if job.kind in job_registry.resumable():
        return True
    if job.progress is None:
        return False
    try:
        read_progress(job.progress)
    except ProgressNotResumable:
        return False
    return True


class JobLease:
    """A job taken by ID: its row as claimed, the lease that owns it, and its outcomes.

    ``token`` and ``fence`` are the lease: hand them to another process or
    request to continue there (:func:`resume_lease`). Every outcome
    (:meth:`complete`, :meth:`fail`, :meth:`snooze`, :meth:`release`,
    :meth:`cancel`) runs on the Django connection of the job's database, so
    inside ``transaction.atomic()`` it commits or rolls back with the caller's
    rows, and raises :class:`JobFenced` (writing nothing) once the lease no
    longer owns the job.
    """

    def __init__(
        self, job: JobRow, lease: LeaseFence, expires_at: dt.datetime, engine: BaseEngine
    ) -> None:
        self.job = job
        self.token: uuid.UUID = lease.token
        self.fence: int = lease.fence
        #: The lease's expiry by database time, as of the claim or the last renewal.
        self.expires_at = expires_at
        #: Set by a renewal that found a cancel requested (``cancel_job``).
        self.cancel_requested = job.cancel_requested_at is not None
        #: The state the attempt ended in, once that outcome committed; else None.
        self.outcome: str | None = None
        self._engine = engine
        self._reported = False
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JobLease {self.job.kind} {self.id} fence={self.fence} outcome={self.outcome}>"

    @property
    def id(self) -> JobID:
        """Return the leased job's ID."""
        return self.job.id

    @property
    def attempt(self) -> int:
        """Return the number of the attempt this lease holds."""
        return self.job.attempt

    # -- the lease ---------------------------------------------------------------

    def renew(self) -> dt.datetime:
        """Extend the lease by its duration from database now; return the new expiry.

        Also refreshes :attr:`cancel_requested`. Succeeds past ``expires_at``
        until the leader's expirer has ended the attempt; raises JobFenced from
        then on (stop working: nothing the holder writes will be kept).
        """
        status = self._engine.job_lease_renew(
            JobLeaseRenewParams(id=self.id, lease=LeaseFence(self.token, self.fence))
        )
        self.expires_at = status.expires_at
        self.cancel_requested = status.cancel_requested
        return status.expires_at

    def record_progress(
        self,
        step: str | None = None,
        cursor: JSON = None,
        *,
        keep_step: bool = False,
        no_wait: bool = False,
    ) -> Progress:
        """Store the step reached and a cursor to resume from, fenced to this lease.

        See :meth:`django_hopper.context.JobContext.record_progress` for
        ``keep_step`` and ``no_wait``. Raises JobFenced when the lease no
        longer owns the job, JobLocked with ``no_wait`` when another
        transaction holds the job's row.
        """
        name = validation.progress_step(step, keep_step)
        if _is_resumable_run(self.job):
            raise InvalidJob(
                f"job {self.id} is a resumable run: its progress is the cursor its passes "
                "commit, and recording progress would overwrite where the run resumes "
                "(drive its passes with drive() instead)",
                field="progress",
            )
        progress = self._engine.job_record_progress(
            JobRecordProgressParams(
                id=self.id,
                attempted_by=None,
                fence=self.fence,
                attempt=self.attempt,
                lease_token=self.token,
                step=name,
                keep_step=keep_step,
                cursor=cursor,
                no_wait=no_wait,
            )
        )
        if progress is None:
            raise JobFenced(f"job {self.id}: the lease no longer owns the job; nothing recorded")
        self.job.progress = progress
        return progress

    def log(self, msg: str) -> None:
        """Add a line to the attempt's log, stored with its outcome."""
        line = str(msg)
        with self._lines_lock:
            self._lines.append(line if line.endswith("\n") else line + "\n")

    def _log_text(self) -> str | None:
        with self._lines_lock:
            return "".join(self._lines) or None

    # -- outcomes ----------------------------------------------------------------

    def complete(self, output: Any = None) -> None:
        """Complete the job with ``output`` (JSON), in the caller's transaction."""
        value = validation.json_normalize(output, "output")
        fn = _job_function(self.job.kind)
        self._finalize(completed(self.job, value, self._log_text(), fn=fn))

    def fail(self, error: str | BaseException, *, discard: bool = False) -> None:
        """Fail the attempt: retried after the backoff, or discarded on the last
        attempt (or at once with ``discard``). A requested cancel wins: canceled."""
        if isinstance(error, BaseException):
            message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        else:
            message, trace = str(error), ""
        result = failed(self.job, message, trace, self._log_text())
        if discard:
            result = dataclasses.replace(result, state=JobState.DISCARDED, delay=dt.timedelta(0))
        self._finalize(result)

    def snooze(self, delay: float | dt.timedelta, reason: str = "") -> None:
        """Run the job again after ``delay`` (seconds), giving the attempt back."""
        self._finalize(snoozed(self.job, JobSnooze(delay, reason), self._log_text()))

    def release(self) -> None:
        """Hand the job back without an outcome: waiting again at once, attempt given back."""
        self._finalize(snoozed(self.job, JobSnooze(0, RELEASED_REASON), self._log_text()))

    def cancel(self, reason: str = "canceled") -> None:
        """End the job as canceled (for a holder that honours a cancel request)."""
        self._finalize(canceled(self.job, self._log_text(), reason))

    def _finalize(self, result: JobFinalize) -> None:
        """Apply one result fenced to this lease; JobFenced if it did not apply."""
        result = dataclasses.replace(result, attempted_by=None, lease_token=self.token)
        applied = self._engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[result],
                no_batches=self.job.batch_id is None,
                keep_logs=int(hopper_settings.KEEP_LOGS),
            )
        )
        if not applied:
            raise JobFenced(
                f"job {self.id}: the lease no longer owns the job (it expired, or the attempt "
                "already ended); nothing was written"
            )
        self._reported = True
        state = result.state
        transaction.on_commit(lambda: self._ended(state), using=self._engine.alias)

    def _ended(self, state: str) -> None:
        """Once an outcome commits: remember it, settle batches, announce a final state.

        No worker announces a leased attempt, so ``jobs_ended`` does (the Django
        Tasks backend turns it into ``task_finished``). The outcome is already
        committed: a failure here is logged, never raised to the holder.
        """
        self.outcome = state
        settle_finished(self._engine, [self.job])
        if state not in FINAL_STATES or not signals.jobs_ended.receivers:
            return
        try:
            row = self._engine.job_get(self.id)
        except HopperError:
            logger.warning("reading job %s to announce its end failed", self.id, exc_info=True)
            return
        # A completion that keeps no history row is announced as claimed, with its state.
        ended = row if row is not None else dataclasses.replace(self.job, state=state)
        signals.send_logged(signals.jobs_ended, jobs=[ended])


def _wait_flags(nowait: Any, skip_locked: Any) -> None:
    for name, value in (("nowait", nowait), ("skip_locked", skip_locked)):
        if type(value) is not bool:
            raise InvalidJob(f"{name} must be True or False, not {value!r}", field=name)
    if nowait and skip_locked:
        raise InvalidJob("nowait and skip_locked are mutually exclusive", field="skip_locked")


@overload
def claim_job(
    job_id: JobID | str,
    *,
    lease: float | dt.timedelta = ...,
    nowait: bool = ...,
    skip_locked: Literal[False] = ...,
    fence: int | None = ...,
    using: str | None = ...,
) -> JobLease: ...


@overload
def claim_job(
    job_id: JobID | str,
    *,
    lease: float | dt.timedelta = ...,
    nowait: bool = ...,
    skip_locked: bool,
    fence: int | None = ...,
    using: str | None = ...,
) -> JobLease | None: ...


def claim_job(
    job_id: JobID | str,
    *,
    lease: float | dt.timedelta = DEFAULT_LEASE,
    nowait: bool = False,
    skip_locked: bool = False,
    fence: int | None = None,
    using: str | None = None,
) -> JobLease | None:
    """Take a waiting job (available, scheduled or retryable, whatever its schedule)
    by ID under a new lease of ``lease`` (seconds or a timedelta, at least a second).

    Waits for the job's row if another transaction holds it, as Django's
    ``select_for_update()`` does; ``nowait=True`` raises JobLocked at once
    instead, and ``skip_locked=True`` returns None. ``fence`` pins the claim
    to the job as you read it (``get_job(id).fence``): if any claim took the
    job since, JobFenced. Without it, a job another claim took and ended in
    the meantime is claimed at its new fence. The job is found on the alias
    its queue lives on (``QUEUE_DATABASES``), or on ``using``; the claim runs
    on that alias's connection, in its transaction if one is open.

    Raises NotFound (no such job), JobNotClaimable (finished, pending, past
    its TTL, its queue paused, or behind an older job of its ordering key),
    JobRunning (a worker or another lease holds it). The queue's limits do not
    apply. Prefer :func:`lease_job`, which also ends the attempt on the way out.
    """
    jid, ttl = _claim_args(job_id, lease, nowait, skip_locked, fence)
    engine, current = _find(jid, using)
    return _claim(engine, jid, current, ttl, nowait, skip_locked, fence)


def _claim_args(
    job_id: Any, lease: Any, nowait: Any, skip_locked: Any, fence: Any
) -> tuple[JobID, dt.timedelta]:
    """Refuse bad claim arguments before any read; return the ID and the lease's TTL."""
    jid = parse_job_id(job_id)
    ttl = _lease_ttl(lease)
    _wait_flags(nowait, skip_locked)
    if fence is not None and (type(fence) is not int or fence < 0):
        raise InvalidJob(f"fence must be a non-negative integer, not {fence!r}", field="fence")
    return jid, ttl


def _claim(
    engine: BaseEngine,
    jid: JobID,
    current: JobRow | None,
    ttl: dt.timedelta,
    nowait: bool,
    skip_locked: bool,
    fence: int | None,
) -> JobLease | None:
    """Claim ``jid`` on ``engine`` at ``fence``, or at the fence of ``current`` (read
    again when another claim took and ended the job since that read)."""
    for tries_left in range(_FENCE_RETRIES, 0, -1):
        at = fence
        if at is None:
            if current is None:
                raise NotFound(f"job {jid} does not exist")
            at = current.fence
        try:
            row = engine.job_claim_by_id(
                JobClaimByIDParams(id=jid, fence=at, ttl=ttl, no_wait=nowait or skip_locked)
            )
        except JobLocked:
            if skip_locked:
                return None
            raise
        except JobFenced:
            if fence is not None or tries_left == 1:
                raise
            current = engine.job_get(jid)  # taken and ended since the read: read it again
            continue
        return JobLease(row.job, row.lease, row.expires_at, engine)
    raise AssertionError("unreachable")  # pragma: no cover


def resume_lease(
    job_id: JobID | str, *, token: uuid.UUID | str, fence: int, using: str | None = None
) -> JobLease:
    """Return the lease ``(token, fence)`` on a job, to continue it in this process.

    Renews the lease at once, which proves it: raises JobFenced if the lease
    no longer owns the job (expired and ended, or a wrong token), NotFound for
    an unknown job.
    """
    jid = parse_job_id(job_id)
    tok = parse_job_id(token, "token")
    if type(fence) is not int or fence < 0:
        raise InvalidJob(f"fence must be a non-negative integer, not {fence!r}", field="fence")
    engine, job = _find(jid, using)
    if job is None:
        raise NotFound(f"job {jid} does not exist")
    status = engine.job_lease_renew(JobLeaseRenewParams(id=jid, lease=LeaseFence(tok, fence)))
    held = JobLease(job, LeaseFence(tok, fence), status.expires_at, engine)
    held.cancel_requested = status.cancel_requested
    return held


@overload
def lease_job(
    job_id: JobID | str,
    *,
    lease: float | dt.timedelta = ...,
    nowait: bool = ...,
    skip_locked: Literal[False] = ...,
    fence: int | None = ...,
    using: str | None = ...,
) -> AbstractContextManager[JobLease]: ...


@overload
def lease_job(
    job_id: JobID | str,
    *,
    lease: float | dt.timedelta = ...,
    nowait: bool = ...,
    skip_locked: bool,
    fence: int | None = ...,
    using: str | None = ...,
) -> AbstractContextManager[JobLease | None]: ...


def lease_job(
    job_id: JobID | str,
    *,
    lease: float | dt.timedelta = DEFAULT_LEASE,
    nowait: bool = False,
    skip_locked: bool = False,
    fence: int | None = None,
    using: str | None = None,
) -> AbstractContextManager[JobLease | None]:
    """Take a job by ID for the ``with`` block (:func:`claim_job`), and end the
    attempt on the way out unless the block did.

    Yields the :class:`JobLease`, or None with ``skip_locked`` when another
    transaction holds the job's row. Inside a transaction the claim, the block
    and the outcome form one savepoint, so an exception (or a rollback of the
    caller's transaction) leaves the job exactly as it was. The block's exit
    decides an attempt it left open: an ``Exception`` fails it, JobCanceled
    cancels it, and a clean exit or another ``BaseException`` releases the
    job (waiting again at once, attempt given back).
    """
    jid, ttl = _claim_args(job_id, lease, nowait, skip_locked, fence)
    return _lease_block(jid, ttl, nowait, skip_locked, fence, using)


@contextmanager
def _lease_block(
    jid: JobID,
    ttl: dt.timedelta,
    nowait: bool,
    skip_locked: bool,
    fence: int | None,
    using: str | None,
) -> Iterator[JobLease | None]:
    engine, current = _find(jid, using)
    if engine.connection.in_atomic_block:
        # One savepoint: an exception undoes the claim with the block's rows.
        with transaction.atomic(using=engine.alias):
            held = _claim(engine, jid, current, ttl, nowait, skip_locked, fence)
            yield held
            if held is not None and not held._reported:
                _close_unreported(held)
        return
    held = _claim(engine, jid, current, ttl, nowait, skip_locked, fence)
    if held is None:
        yield None
        return
    try:
        yield held
    except JobCanceled:
        _end_quietly(held, held.cancel)
        raise
    except Exception as exc:
        _end_quietly(held, functools.partial(held.fail, exc))
        raise
    except BaseException:
        _end_quietly(held, held.release)
        raise
    if held.outcome is None:
        _close_unreported(held)


def _close_unreported(held: JobLease) -> None:
    """Release a job whose block ended cleanly without an outcome, and say so."""
    logger.warning(
        "the lease on job %s (%s) ended without an outcome; the job is released to run again",
        held.id,
        held.job.kind,
    )
    _end_quietly(held, held.release)


def _end_quietly(held: JobLease, end: Callable[[], None]) -> None:
    """End the attempt on the way out; a lease already lost has nothing to end."""
    if held._reported and held.outcome is None and not held._engine.connection.in_atomic_block:
        # An outcome was written and then rolled back with the caller's transaction.
        held._reported = False
    if held._reported:
        return
    try:
        end()
    except JobFenced:
        pass
    except HopperError:
        logger.warning("ending the leased attempt of job %s failed", held.id, exc_info=True)
