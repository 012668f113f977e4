"""What a running job sees of hopper: :class:`JobContext`.

A job function declared with ``takes_context`` receives a context as its first
argument. Through it the job reads its claim (ID, attempt, metadata, stored
progress), records progress fenced to its claim, writes log lines that are
stored with the attempt, snoozes, and notices cooperative cancellation.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from asgiref.sync import sync_to_async

from django_hopper import validation
from django_hopper.engine.params import JobRecordProgressParams
from django_hopper.exceptions import InvalidJob, JobCanceled, JobFenced

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JSON, Dependency, JobID, JobRow, Progress


class JobSnooze(Exception):
    """Raised by :meth:`JobContext.snooze`; the worker turns it into a snooze.

    A snooze gives the attempt back: the job runs again after ``delay`` with the
    same attempt number. Job code may raise it directly as well.
    """

    def __init__(self, delay: float | dt.timedelta, reason: str = "") -> None:
        seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay)
        if seconds < 0:
            raise ValueError("a snooze delay cannot be negative")
        super().__init__(reason or f"snoozed for {seconds}s")
        self.delay = dt.timedelta(seconds=seconds)
        self.reason = reason


class JobDiscard(Exception):
    """Raised to fail the job now, whatever attempts it has left: the worker
    discards it with this error (retrying cannot help, e.g. a resumable step
    that used up its own retry budget)."""


class AttemptSettled(Exception):
    """Raised by code that has already ended its own attempt, fenced to its claim.

    The runner writes no result for the attempt: a resumable pass whose claim did
    not BEGIN recorded an admission miss (and how the run waits, or fails) itself.
    ``state`` is what that ending left the job in, for ``job_finished``.
    """

    def __init__(self, state: str, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


class JobContext:
    """The view a running attempt has of its job.

    Thread-safe where it must be: the worker sets :attr:`cancelled` from another
    thread while the job reads it.
    """

    def __init__(self, job: JobRow, engine: BaseEngine) -> None:
        self.job = job
        self._engine = engine
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()
        #: Set once from another thread (the worker), read by the attempt: a
        #: plain flag, since nothing waits on it (an Event costs a Condition
        #: per job).
        self._cancelled = False
        self._lost = False
        self.progress: Progress | None = job.progress
        #: Set when something else owns the job's progress (a resumable run
        #: stores its committed cursor there): record_progress then refuses.
        self.progress_owner: str | None = None
        #: The job lease the attempt is fenced to, when one owns the job: a claim
        #: by ID, or a resumable pass after BEGIN. Its result is fenced to it.
        self.lease_token: JobID | None = None
        #: Set by the worker running the attempt: completes it at once, in the
        #: caller's transaction (:meth:`complete`). None outside a worker.
        self.completion: Callable[[JSON], None] | None = None

    # -- the claim ----------------------------------------------------------

    @property
    def job_id(self) -> JobID:
        """Return the job's ID."""
        return self.job.id

    @property
    def attempt(self) -> int:
        """Return this attempt's number (1 for the first run)."""
        return self.job.attempt

    @property
    def metadata(self) -> Any:
        """Return the job's metadata as stored at the claim."""
        return self.job.metadata

    @property
    def lost(self) -> bool:
        """Return True once the attempt learned that it no longer owns the job."""
        return self._lost

    # -- workflow dependencies --------------------------------------

    @property
    def dependencies(self) -> list[Dependency]:
        """Return the finished dependencies this workflow step reads, by dependency ID.

        Each has the dependency's ``id``, ``step``, final ``state`` and ``output``.
        Empty for a job that reads none.
        """
        return list(self.job.dependencies or [])

    def dependency_output(self, step: str) -> Any:
        """Return the output of the dependency named ``step``.

        Raises KeyError naming the steps this job reads when it reads no such step.
        """
        for dep in self.job.dependencies or []:
            if dep.step == step:
                return dep.output
        names = [d.step or str(d.id) for d in self.job.dependencies or []]
        raise KeyError(
            f"job {self.job.id} reads no dependency named {step!r} (it reads {names}); "
            "add it to reads=[...] in the workflow"
        )

    # -- snooze -------------------------------------------------------------

    def snooze(self, delay: float | dt.timedelta, reason: str = "") -> NoReturn:
        """End the attempt now and run the job again after ``delay`` seconds.

        Raises :class:`JobSnooze`, so nothing after the call runs; the attempt
        is given back and does not count against ``max_attempts``.
        """
        raise JobSnooze(delay, reason)

    # -- progress -----------------------------------------------------------

    def _progress_params(
        self, step: str | None, cursor: JSON, keep_step: bool, no_wait: bool
    ) -> JobRecordProgressParams:
        if self.progress_owner is not None:
            raise InvalidJob(
                f"this job's progress belongs to its {self.progress_owner}: recording "
                "progress would overwrite where the run resumes (return Pass(cursor=...) "
                "instead)",
                field="progress",
            )
        return JobRecordProgressParams(
            id=self.job.id,
            attempted_by=self.job.attempted_by,
            fence=self.job.fence,
            attempt=self.job.attempt,
            step=validation.progress_step(step, keep_step),
            keep_step=keep_step,
            cursor=cursor,
            no_wait=no_wait,
        )

    def _stored(self, progress: Progress | None) -> bool:
        if progress is None:
            self._lost = True
            return False
        self.progress = progress
        return True

    def record_progress(
        self,
        step: str | None = None,
        cursor: JSON = None,
        *,
        keep_step: bool = False,
        no_wait: bool = False,
    ) -> bool:
        """Store the step reached (and a cursor to resume from), fenced to this claim.

        Return True when stored, False when the attempt no longer owns the job
        (it was rescued or fenced): the job should stop, since nothing it
        writes through hopper will be kept. :meth:`check_cancelled` raises
        :class:`JobFenced` from then on.

        ``keep_step=True`` (and no step) keeps the stored step and replaces
        only the cursor: a position within the current step, recorded often.
        ``no_wait=True`` never waits for the job's row: if another transaction
        holds it (on SQLite: if another transaction writes), it raises
        :class:`~django_hopper.exceptions.JobLocked` at once and stores
        nothing, for a job whose progress is best effort and whose time is not.
        Call :meth:`arecord_progress` from an ``async def`` job.
        """
        params = self._progress_params(step, cursor, keep_step, no_wait)
        return self._stored(self._engine.job_record_progress(params))

    async def arecord_progress(
        self,
        step: str | None = None,
        cursor: JSON = None,
        *,
        keep_step: bool = False,
        no_wait: bool = False,
    ) -> bool:
        """Store progress from an ``async def`` job (see :meth:`record_progress`)."""
        params = self._progress_params(step, cursor, keep_step, no_wait)
        progress = await sync_to_async(self._engine.job_record_progress)(params)
        return self._stored(progress)

    # -- completing inside the job's own transaction -------------------------

    def complete(self, output: JSON = None) -> None:
        """Complete the job now, in the transaction the job has open, so that the
        job's own rows and its completion commit together, or neither does.

        Once that transaction commits the job is completed with ``output``
        (and the log lines so far); what the function returns or raises
        afterwards is ignored. If it rolls back, nothing happened: the attempt
        goes on and ends as it would have. Outside a transaction the
        completion commits at once. Raises JobFenced, writing nothing, when
        the attempt no longer owns the job (also once the attempt has ended,
        from a thread the job left running), and InvalidJob for an output that
        is not JSON or a resumable pass (which ends by returning ``Pass``).
        """
        if self.completion is None or self.progress_owner is not None:
            raise InvalidJob(
                "complete() ends an attempt a worker runs; a resumable pass returns "
                "Pass(done=True), and a job taken by ID completes through its lease",
                field="complete",
            )
        self.completion(validation.json_normalize(output, "output"))

    def end(self) -> None:
        """Let go of the attempt's completion once the attempt has ended.

        The completion refers to the execution, which refers to this context:
        dropping it frees the attempt's objects by their reference counts,
        never by the cyclic collector, whose full collections stop every
        thread of the worker. A ``complete()`` after this raises JobFenced:
        the attempt no longer owns the job.
        """
        self.completion = _attempt_ended

    def lost_claim(self) -> None:
        """Record that the attempt learned it no longer owns the job."""
        self._lost = True

    # -- logs ---------------------------------------------------------------

    def log(self, msg: str) -> None:
        """Add a line to this attempt's log, stored with the result at finalize."""
        line = str(msg)
        if not line.endswith("\n"):
            line += "\n"
        with self._lines_lock:
            self._lines.append(line)

    def log_text(self) -> str | None:
        """Return the attempt's collected log, or None if it logged nothing."""
        with self._lines_lock:
            return "".join(self._lines) or None

    # -- cancellation -------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Return True once cancellation of the attempt was requested (or it timed out)."""
        return self._cancelled

    def cancel(self) -> None:
        """Mark the attempt cancelled (called by the worker, from another thread)."""
        self._cancelled = True

    def check_cancelled(self) -> None:
        """Raise if the attempt should stop: cooperative cancellation for sync jobs.

        Raises :class:`~django_hopper.exceptions.JobCanceled` after a cancel
        request (or a timeout), and :class:`~django_hopper.exceptions.JobFenced`
        after the attempt learned it lost the job.
        """
        if self._lost:
            raise JobFenced(f"job {self.job.id} is no longer owned by this attempt")
        if self._cancelled:
            raise JobCanceled(f"job {self.job.id} was cancelled")

    def __repr__(self) -> str:
        return f"<JobContext {self.job.kind} {self.job.id} attempt={self.job.attempt}>"


def _attempt_ended(output: JSON) -> None:
    """Refuse to complete an attempt that has ended (a module function: it holds nothing)."""
    raise JobFenced("the attempt has ended: complete() came after its result")
