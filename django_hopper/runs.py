"""Resumable long jobs: a run walked in passes, with memoized steps.

A *run* is one job. Its function is a *pass*: it is called with a :class:`Run`
and the job's arguments, does a bounded chunk of work from ``run.cursor``, and
says where the next pass starts::

    @resumable(queue="imports", max_attempts=5)
    def import_catalog(run: Run, supplier_id: int) -> Pass:
        page = run.step("fetch", lambda: fetch_page(supplier_id, run.cursor))
        run.step("store", lambda: store_rows(page["rows"]))
        run.count("rows", len(page["rows"]))
        if page["next"] is None:
            return Pass(done=True)
        return Pass(cursor=page["next"])

    import_catalog.start(supplier_id=7, instance="7")

How hopper maps it (docs/resumable.md):

* a pass is an attempt: the worker claims the job as any other, and the pass
  runs fenced to that claim (client + fence, or a job lease + fence);
* a *step* (``run.step(name, fn)``) is memoized in the job's step ledger: a
  step whose result is recorded returns it without running ``fn`` again, so a
  pass that crashed and runs again skips what already succeeded;
* a pass that returns not done *commits*: the cursor and counters become the
  job's progress and the ledger is dropped, in one transaction fenced to the
  claim; the job is then snoozed (its attempt given back) and the next pass
  runs at once. A pass that returns done commits (its progress marked done)
  and completes the job with ``{"cursor": ..., "counters": ...}`` as its
  output; if its worker dies between the two, the next pass finds the mark and
  completes the job with that output without running the pass function;
* a pass that raises commits nothing of its own (cursor and counters stay as
  the last commit left them) and keeps the ledger; the job retries with
  backoff, and ``max_attempts`` counts consecutive failed passes, since a
  commit sets the attempt back;
* ``start(..., instance=...)`` coalesces: the run's unique key is
  ``"<kind>:<instance>"``, so a second start while the run is live returns it
  (``handle.duplicate``); a finished run does not block a new one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import time
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from django.db import transaction

from django_hopper import jobs, validation
from django_hopper import registry as jobs_registry
from django_hopper.api import _strings, list_jobs, parse_job_id
from django_hopper.conf import hopper_settings
from django_hopper.context import AttemptSettled, JobContext, JobDiscard, JobSnooze
from django_hopper.engine import get_engine
from django_hopper.engine.params import (
    JobClaimByIDParams,
    JobFinalizeParams,
    JobListParams,
    JobPassBeginParams,
    JobPassGetManyParams,
    JobPassMissParams,
    JobPassRow,
    JobPassTakeoverParams,
    JobRecordProgressParams,
    JobStepGetParams,
    JobStepRecordParams,
    JobStepsClearParams,
)
from django_hopper.exceptions import (
    HopperError,
    InvalidJob,
    JobCanceled,
    JobFenced,
    JobNotClaimable,
    JobRunning,
    NotFound,
)
from django_hopper.jobs import EnqueueOptions, JobFunction, JobHandle
from django_hopper.registry import registry
from django_hopper.types import JobState
from django_hopper.worker.completer import settle_finished
from django_hopper.worker.execution import (
    _call_args,
    canceled,
    completed,
    discarded,
    failed,
    snoozed,
)

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JSON, JobID, JobRow, Progress

P = ParamSpec("P")
T = TypeVar("T")

#: The progress step name of a committed pass.
COMMITTED_STEP = "pass"
#: The snooze reason of a pass that committed and hands over to the next one.
NEXT_PASS_REASON = "resumable: next pass"

_KEEP: Any = object()

logger = logging.getLogger("django_hopper.runs")

#: The instance of a run started without one: a job with one walk at a time.
DEFAULT_INSTANCE = "default"


class DuplicateStep(HopperError, ValueError):
    """A pass called ``run.step`` twice with one name: names key the memo, so they
    must be unique within a pass (a loop needs ``f"page-{i}"``, not ``"page"``)."""


class StepExhausted(HopperError, JobDiscard):
    """A step used up its own retry budget (``run.step(..., max_attempts=n)``)
    across passes: the run fails now with the step's last error, whatever
    attempts the job has left, since passes would only repeat the same failure."""


@dataclasses.dataclass(frozen=True, slots=True)
class Pass:
    """What a pass returns: where the next pass starts, or that the run is done.

    ``cursor`` left out keeps the current cursor.
    """

    cursor: Any = _KEEP
    done: bool = False


def stored_progress(
    cursor: JSON, counters: dict[str, int], passes: int, *, done: bool = False
) -> dict[str, Any]:
    """Return the progress cursor a committed pass stores: the one place its shape is decided.

    Counters live inside the stored cursor so that one fenced write commits both.
    ``done`` marks the commit of the finishing pass: the job's completion is a
    later write, and a pass that runs again after a crash between the two must
    find the run finished rather than walk the last chunk (and count it) twice.
    """
    stored: dict[str, Any] = {"cursor": cursor, "counters": dict(counters), "passes": passes}
    if done:
        stored["done"] = True
    return stored


class ProgressNotResumable(HopperError, ValueError):
    """A run's stored progress is not what a committed pass writes.

    A resumable run reads its cursor from the job's progress; progress of any
    other shape (recorded by a plain job, by hand, or by a different version of
    the code) cannot say where the walk stands, and reading it as "no pass
    committed" would restart the walk from scratch without a word. The pass
    fails with this instead; ``retry_job(id, from_start=True)`` walks again on
    purpose.
    """


def read_progress(progress: Progress | None) -> tuple[JSON, dict[str, int], int, bool]:
    """Return (cursor, counters, passes committed, finished) from a job's stored progress.

    No progress is a run before its first commit. Anything but what
    :func:`stored_progress` writes, under the step name :data:`COMMITTED_STEP`,
    raises :class:`ProgressNotResumable` naming it: a run never restarts
    silently.
    """
    if progress is None:
        return None, {}, 0, False
    stored = progress.cursor
    problem = _progress_problem(progress.step, stored)
    if problem:
        raise ProgressNotResumable(
            f"the job's progress (step {progress.step!r}, cursor {_short(stored)}) is not a "
            f"committed pass of a resumable run: {problem}. Refusing to restart the walk from "
            "scratch: retry_job(id, from_start=True) walks again on purpose"
        )
    assert isinstance(stored, dict)
    return stored["cursor"], dict(stored["counters"]), stored["passes"], stored.get("done") is True


def _progress_problem(step: str, stored: Any) -> str:
    """Return what makes a stored progress unlike a committed pass's, or ''."""
    if step != COMMITTED_STEP:
        return f"its step is not {COMMITTED_STEP!r}"
    if not isinstance(stored, dict) or not {"cursor", "counters", "passes"} <= stored.keys():
        return "its cursor is not an object with cursor, counters and passes"
    counters, passes = stored["counters"], stored["passes"]
    if not isinstance(counters, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in counters.items()
    ):
        return "its counters are not an object of integers"
    if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
        return "its passes are not a positive integer"
    if stored.get("done", False) not in (True, False):
        return "its done mark is not true or false"
    return ""


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_output(cursor: JSON, counters: dict[str, int]) -> dict[str, Any]:
    """Return a finished run's output: the one place its shape is decided."""
    return {"cursor": cursor, "counters": dict(counters)}


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """The claim a pass runs under; every write the pass makes is fenced on it."""

    id: JobID
    attempted_by: int | None
    fence: int
    attempt: int
    lease_token: JobID | None = None

    def fields(self) -> dict[str, Any]:
        """Return the fence fields the step-ledger params share."""
        return {
            "id": self.id,
            "attempted_by": None if self.lease_token else self.attempted_by,
            "fence": self.fence,
            "lease_token": self.lease_token,
        }


class Run:
    """What a pass sees of its run: the committed cursor, counters and the step memo."""

    def __init__(self, context: JobContext, engine: BaseEngine, claim: Claim) -> None:
        self.context = context
        # The committed cursor lives in the job's progress: nothing else writes it.
        context.progress_owner = "resumable run"
        self._engine = engine
        self._claim = claim
        self._cursor, self._counters, self._passes, finished = read_progress(context.job.progress)
        #: The finishing pass already committed (its worker died before the job
        #: completed): the run's output is stored, and no pass runs again.
        self.finished = finished
        self._seen: set[str] = set()

    @property
    def job_id(self) -> JobID:
        """Return the run's job ID."""
        return self._claim.id

    @property
    def cursor(self) -> JSON:
        """Return the cursor the last committed pass left (None before the first)."""
        return self._cursor

    @property
    def counters(self) -> dict[str, int]:
        """Return the counters: the committed totals plus this pass's counts so far."""
        return dict(self._counters)

    @property
    def passes(self) -> int:
        """Return how many passes have committed before this one."""
        return self._passes

    def count(self, name: str, by: int = 1) -> int:
        """Add ``by`` to a counter; it is committed with the pass, or dropped if it fails.

        Count outside step functions (from their results): a memoized step does
        not run again, but the pass around it does, with its counts reset.
        """
        if not isinstance(name, str) or not name:
            # Counters are stored as a JSON object: a key that is not text would
            # read back as another name after the commit.
            raise InvalidJob(f"a counter's name is a non-empty string, not {name!r}", field="name")
        if not isinstance(by, int) or isinstance(by, bool):
            raise InvalidJob(f"count by an integer, not {by!r}", field="by")
        self._counters[name] = self._counters.get(name, 0) + by
        return self._counters[name]

    def step(
        self, name: str, fn: Callable[[], T], retry: int = 0, max_attempts: int | None = None
    ) -> T:
        """Run ``fn`` once per run between commits, and return its result.

        A step whose result is recorded returns it without calling ``fn`` (a
        pass that crashed after it resumes past it). The result is recorded as
        JSON and returned as it reads back, so a fresh and a memoized run of
        the pass see the same value. ``retry`` more tries are made at once,
        each failure recorded in the ledger, before the error fails the pass.

        ``max_attempts`` is the step's own budget of tries across passes (the
        ledger counts them until a pass commits); it defaults to the job's
        ``max_attempts`` and may narrow it, never widen it. The try that uses
        it up fails the run at once with :class:`StepExhausted`.
        """

        if name in self._seen:
            raise DuplicateStep(
                f"step {name!r} ran twice in one pass of job {self._claim.id}; "
                "step names key the memo and must be unique within a pass"
            )
        if not isinstance(retry, int) or isinstance(retry, bool) or retry < 0:
            raise InvalidJob(f"retry must be a non-negative integer, not {retry!r}", field="retry")
        budget = self._step_budget(max_attempts)
        self._seen.add(name)
        ledger = self._engine
        row = ledger.job_step_get(JobStepGetParams(step=name, **self._claim.fields()))
        if row is not None and row.done:
            return row.result  # type: ignore[no-any-return]
        if row is not None and row.attempts >= budget:
            raise StepExhausted(_exhausted(name, row.attempts, budget, row.last_error))
        tries = retry + 1
        while True:
            self.context.check_cancelled()
            try:
                value = validation.json_normalize(fn(), f"step {name!r} result")
            except (JobFenced, JobCanceled):
                raise
            except Exception as exc:
                tries -= 1
                error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                row = ledger.job_step_record(
                    JobStepRecordParams(step=name, done=False, error=error, **self._claim.fields())
                )
                if row.attempts >= budget:
                    raise StepExhausted(_exhausted(name, row.attempts, budget, error)) from exc
                if tries <= 0:
                    raise
                continue
            ledger.job_step_record(
                JobStepRecordParams(step=name, done=True, result=value, **self._claim.fields())
            )
            return value  # type: ignore[no-any-return]

    def _step_budget(self, max_attempts: int | None) -> int:
        """Return a step's budget of tries: the job's ``max_attempts`` or fewer."""
        job_max = self.context.job.max_attempts
        if max_attempts is None:
            return job_max
        if (
            not isinstance(max_attempts, int)
            or isinstance(max_attempts, bool)
            or not 1 <= max_attempts <= job_max
        ):
            raise InvalidJob(
                f"a step's max_attempts must be an integer from 1 to the job's max_attempts "
                f"({job_max}), not {max_attempts!r}: a step may narrow the job's retry "
                "policy, never widen it",
                field="max_attempts",
            )
        return max_attempts

    def commit(self, cursor: JSON, *, done: bool) -> dict[str, Any]:
        """Store the cursor and counters and drop the ledger, in one fenced transaction.

        Raises JobFenced, writing nothing, if the claim lost the job. The
        attempt is set back, so that attempts count consecutive failed passes
        (a finishing pass too: a crash before its completion lands must not
        discard a finished run). A finishing pass's progress is marked done, so
        a pass that runs again after such a crash returns the stored output.
        """

        value = validation.json_normalize(cursor, "cursor")
        stored = stored_progress(value, self._counters, self._passes + 1, done=done)
        c = self._claim
        with transaction.atomic(using=self._engine.alias):
            progress = self._engine.job_record_progress(
                JobRecordProgressParams(
                    id=c.id,
                    attempted_by=None if c.lease_token else c.attempted_by,
                    fence=c.fence,
                    attempt=c.attempt,
                    lease_token=c.lease_token,
                    step=COMMITTED_STEP,
                    cursor=stored,
                )
            )
            if progress is None:
                raise JobFenced(f"job {c.id} is no longer owned by this pass; nothing committed")
            self._engine.job_steps_clear(JobStepsClearParams(reset_attempt=True, **c.fields()))
        self._cursor, self._passes = value, self._passes + 1
        self.finished = done
        return run_output(value, self._counters)


def _exhausted(name: str, attempts: int, budget: int, error: str | None) -> str:
    return (
        f"step {name!r} failed {attempts} times, its retry budget (max_attempts={budget}), "
        f"so the run fails: {error}"
    )


def claim_of(context: JobContext) -> Claim:
    """Return the claim a context's attempt holds (a leased context carries its token)."""
    job = context.job
    return Claim(
        id=job.id,
        attempted_by=job.attempted_by,
        fence=job.fence,
        attempt=job.attempt,
        lease_token=context.lease_token,
    )


def pass_margin(lease: dt.timedelta) -> dt.timedelta:
    """Return how much of its ``lease`` a claimed pass must still have left to BEGIN."""
    return lease * float(hopper_settings.PASS_LEASE_MARGIN)


def begin_pass(
    engine: BaseEngine, context: JobContext, lease: dt.timedelta, waited: float | None = None
) -> Claim:
    """BEGIN the claimed pass, or record an admission miss and raise AttemptSettled.

    The commitment point: the handler runs if and only if BEGIN wrote, and
    nothing second-guesses its reply. ``waited`` is how long (this process's
    monotonic clock) the claim took to come back, when the caller measured it:
    a claim that already spent its lease past the margin does not even try.
    A claim that does not begin ran nothing, so it costs no attempt; the run
    waits (doubling) and fails only after ``ADMISSION_MISS_MAX`` misses in a row.
    """
    claim = claim_of(context)
    margin = pass_margin(lease)
    job = context.job
    if waited is not None and dt.timedelta(seconds=waited) >= lease - margin:
        reason = (
            f"the claim came back after {waited:.3f}s, leaving less than the margin "
            f"({margin.total_seconds():g}s) of its {lease.total_seconds():g}s lease"
        )
    else:
        begun = engine.job_pass_begin(
            JobPassBeginParams(
                id=claim.id,
                attempted_by=None if claim.lease_token else claim.attempted_by,
                fence=claim.fence,
                ttl=lease,
                margin=margin,
                lease_token=claim.lease_token,
            )
        )
        if begun is not None:
            context.lease_token = begun.lease.token
            return dataclasses.replace(claim, lease_token=begun.lease.token)
        reason = (
            f"BEGIN refused: by database time the claim no longer held the run, or "
            f"its {lease.total_seconds():g}s lease had no more than the margin "
            f"({margin.total_seconds():g}s) left"
        )
    missed = engine.job_pass_miss(
        JobPassMissParams(
            id=claim.id,
            attempted_by=None if claim.lease_token else claim.attempted_by,
            fence=claim.fence,
            max_misses=int(hopper_settings.ADMISSION_MISS_MAX),
            reason=reason,
            lease_token=claim.lease_token,
        )
    )
    if missed is None:
        raise AttemptSettled(JobState.RUNNING, f"job {job.id}: the claim lost the run")
    logger.warning(
        "resumable run %s (%s) did not begin its pass: %s; admission miss %d of %d%s",
        job.id,
        job.kind,
        reason,
        missed.misses,
        int(hopper_settings.ADMISSION_MISS_MAX),
        ", the run fails" if missed.failed else "",
    )
    state = JobState.DISCARDED if missed.failed else JobState.SCHEDULED
    raise AttemptSettled(state, reason)


def run_pass(
    pass_fn: Callable[..., Pass | None],
    context: JobContext,
    args: Any,
    kwargs: Any,
    engine: BaseEngine | None = None,
    lease: dt.timedelta | None = None,
    waited: float | None = None,
) -> dict[str, Any]:
    """Run one pass and commit what it returned; the rule every runner uses.

    The pass first BEGINs under a pass lease of ``lease`` (:func:`begin_pass`;
    a claim that does not begin raises AttemptSettled, its miss recorded).
    Returns the run's output when the pass finished it; raises JobSnooze (the
    next pass, at once) after a commit that is not the last; lets a failure
    propagate with nothing committed.
    """

    engine = engine or get_engine()
    run = Run(context, engine, claim_of(context))
    if run.finished:
        # The finishing pass committed but its worker died before the job
        # completed: complete it now with what that pass stored.
        return run_output(run.cursor, run.counters)
    run._claim = begin_pass(engine, context, lease or DEFAULT_LEASE, waited)
    outcome = pass_fn(run, *args, **kwargs)
    if outcome is None:
        outcome = Pass()
    if not isinstance(outcome, Pass):
        raise InvalidJob(
            f"a resumable pass returns Pass(...) or None, not {outcome!r}", field="return"
        )
    cursor = run.cursor if outcome.cursor is _KEEP else outcome.cursor
    output = run.commit(cursor, done=outcome.done)
    if outcome.done:
        return output
    raise JobSnooze(0, NEXT_PASS_REASON)


class _PassRunner:
    """The job function the worker calls (with its context): one pass of the run,
    under a pass lease of ``lease``."""

    def __init__(self, pass_fn: Callable[..., Pass | None], lease: dt.timedelta) -> None:
        functools.update_wrapper(self, pass_fn)
        self.pass_fn = pass_fn
        self.lease = lease

    def __call__(self, context: JobContext, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return run_pass(self.pass_fn, context, args, kwargs, lease=self.lease)


#: The pass lease of a run whose ``@resumable`` names none.
DEFAULT_LEASE = dt.timedelta(minutes=5)
#: The most expired pass leases one takeover ends.
TAKEOVER_LIMIT = 100


def take_over(engine: BaseEngine, kinds: tuple[str, ...], queue: str | None = None) -> list[Any]:
    """End the expired pass leases of ``kinds`` (in ``queue``), so a claim can take
    their runs over: the rule every claiming runner applies first."""
    if not kinds:
        return []
    return engine.job_pass_takeover_many(
        JobPassTakeoverParams(
            kinds=kinds,
            limit=TAKEOVER_LIMIT,
            max_misses=int(hopper_settings.ADMISSION_MISS_MAX),
            queue=queue,
        )
    )


class ResumableJob(JobFunction[P, T], Generic[P, T]):
    """A ``@resumable`` job: a JobFunction whose attempts are passes, plus ``start``
    and ``drive``."""

    def __init__(
        self, func: Callable[P, T], *, lease: dt.timedelta | None = None, **kwargs: Any
    ) -> None:
        super().__init__(func, **kwargs)
        self.__dict__["lease"] = lease

    @property
    def lease(self) -> dt.timedelta:
        """Return the pass lease every pass of this job holds, by a worker or a drive."""
        return self.__dict__.get("lease") or DEFAULT_LEASE

    def _copy(self, changes: dict[str, Any], options: EnqueueOptions) -> JobFunction[P, T]:
        copy = super()._copy(changes, options)
        copy.__dict__["lease"] = self.__dict__.get("lease")
        return copy

    @property
    def pass_func(self) -> Callable[..., Pass | None]:
        """Return the pass function as written (``func`` is its runner)."""
        return self.func.pass_fn  # type: ignore[attr-defined,no-any-return]

    def start(self, *args: Any, instance: str = DEFAULT_INSTANCE, **kwargs: Any) -> JobHandle:
        """Start the run of ``instance``, or join the live one (``handle.duplicate``).

        The run's unique key is ``"<kind>:<instance>"``: a live run holds it,
        a finished one does not, so a new run can follow a finished one. A job
        with one walk at a time needs no instance: it is ``"default"``.
        """
        if not isinstance(instance, str) or not instance:
            raise InvalidJob(
                f"instance must be a non-empty string, not {instance!r}", field="instance"
            )
        return self.using(unique_key=f"{self.kind}:{instance}").enqueue(*args, **kwargs)

    def pass_state(self, job_id: JobID | str) -> JobPassRow | None:
        """Return what a live run says of its pass: when the holding pass BEGAN (None
        before BEGIN), its lease's expiry, and the run's consecutive admission
        misses. None for a run that is no longer live (its record says how it
        ended)."""
        return get_engine().job_pass_get(parse_job_id(job_id))

    def drive(self, job_id: JobID | str) -> str:
        """Run one pass of the run ``job_id`` in this process, under its pass lease.

        For a run driven without a worker (a cron, a command, a request): the
        pass claims the waiting run by ID (``job_claim_by_id``) with a lease of
        ``lease``, BEGINs (the commitment point), every step boundary renews
        the lease, and every write, the result included, is fenced to it. A run
        whose pass lease expired (its holder hung or died) is taken over first.
        If this process dies, the next claim once the lease has expired (a
        worker's, another drive's) takes the run over. The pass ends as on a
        worker: its ``run.context.log(...)`` lines are kept with the attempt,
        and a run in a batch or workflow settles it. Returns ``"next"``
        (committed, another pass is due), ``"done"``, ``"failed"`` (the pass
        raised: it is retried with backoff, or the run fails when out of
        attempts), ``"canceled"`` (the pass raised JobCanceled: the run ends
        canceled, as on a worker) or ``"missed"`` (the claim did not BEGIN: no
        attempt is charged, the run waits; see docs/resumable.md). Raises what the claim by
        ID raises for a run that is not waiting (running elsewhere, finished,
        paused).
        """

        job_id = parse_job_id(job_id)
        engine = get_engine()
        current = engine.job_get(job_id)
        if current is None:
            raise NotFound(f"no job {job_id}")
        if current.state == JobState.RUNNING and current.lease_expires_at is not None:
            take_over(engine, (self.kind,), current.queue)
            current = engine.job_get(job_id) or current
        sent = time.monotonic()
        leased = engine.job_claim_by_id(
            JobClaimByIDParams(id=job_id, fence=current.fence, ttl=self.lease)
        )
        waited = time.monotonic() - sent
        job = leased.job
        context = JobContext(job, engine)
        context.lease_token = leased.lease.token
        args, kwargs = _call_args(job)
        try:
            output = run_pass(self.pass_func, context, args, kwargs, engine, self.lease, waited)
        except AttemptSettled:
            return "missed"
        except JobSnooze as snooze:
            result, outcome = snoozed(job, snooze, context.log_text()), "next"
        except JobFenced:
            raise
        except JobCanceled:
            result, outcome = canceled(job, context.log_text()), "canceled"
        except JobDiscard as exc:
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            trace = traceback.format_exc()
            result, outcome = discarded(job, error, trace, context.log_text()), "failed"
        except Exception as exc:
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            trace = traceback.format_exc()
            result, outcome = failed(job, error, trace, context.log_text()), "failed"
        else:
            result, outcome = completed(job, output, context.log_text(), fn=self), "done"
        result = dataclasses.replace(result, attempted_by=None, lease_token=context.lease_token)
        params = JobFinalizeParams(
            jobs=[result],
            no_batches=job.batch_id is None,
            keep_logs=int(hopper_settings.KEEP_LOGS),
        )
        applied = engine.job_finalize_many(params)
        if not applied:
            raise JobFenced(f"job {job_id}: the lease expired before the pass ended")
        if job.batch_id is not None:
            settle_finished(engine, [job])
        return outcome


@dataclasses.dataclass(slots=True)
class DriveReport:
    """What one bounded drive (:func:`drive_due`) did."""

    #: Passes that began and ran (each claim that BEGAN).
    driven: int = 0
    #: Runs that finished this drive.
    finished: int = 0
    #: Claims that did not BEGIN: admission misses, no attempt charged.
    missed: int = 0
    #: Passes that failed (the run retries with backoff, or fails out of attempts).
    failed: int = 0
    #: Runs whose pass raised JobCanceled: they ended canceled.
    canceled: int = 0
    #: Expired pass leases taken over before driving.
    taken_over: int = 0
    #: Due runs another worker or drive claimed first, or that stopped being due.
    skipped: int = 0
    #: Why the drive stopped: "done" (nothing more was due), "limit" or "deadline".
    stopped: str = "done"
    #: (run ID, error) of each pass that failed or could not be driven.
    errors: list[tuple[JobID, str]] = dataclasses.field(default_factory=list)
    #: (run ID, why) of each claim that did not BEGIN: not a failure, but a sign
    #: that the run's lease is too short for where it runs.
    warnings: list[tuple[JobID, str]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready data (for cron logs and the command)."""
        data = dataclasses.asdict(self)
        data["errors"] = [{"run": str(i), "error": e} for i, e in self.errors]
        data["warnings"] = [{"run": str(i), "warning": w} for i, w in self.warnings]
        return data


#: The most waiting runs one drive reads to choose its due ones.
DRIVE_SCAN_MAX = 1000


def drive_due(
    *,
    limit: int = 100,
    deadline: float | dt.timedelta | None = None,
    kinds: str | Iterable[str] | None = None,
    queue: str | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> DriveReport:
    """Drive up to ``limit`` due passes of resumable runs in this process, and stop
    at ``deadline`` (seconds from now, by this process's monotonic clock).

    For a cron job or a deploy without workers for these queues: expired pass
    leases are taken over first, then one snapshot of the waiting runs of
    ``kinds`` (every registered ``@resumable`` kind by default) is read and the
    due ones are driven in the order they became due (``scheduled_at``, then
    ID), one pass each, each with :meth:`ResumableJob.drive`. A run another
    process claims first is skipped. No pass starts after the deadline (one that
    started runs to its end: give the deadline a pass's length of slack). One
    run's failure never stops the drive: it is counted and reported.
    ``monotonic`` is the clock the deadline is measured on.
    """
    limit = _positive_int(limit, "limit")
    budget = None if deadline is None else validation.positive_duration(deadline, "deadline")
    if queue is not None:
        validation.queue_name(queue)
    engine = get_engine()
    chosen = jobs_registry.resumable() if kinds is None else _strings(kinds, "kinds")
    report = DriveReport()
    if not chosen:
        return report
    started = monotonic()
    report.taken_over = len(take_over(engine, chosen, queue))
    now = engine.now()
    waiting = engine.job_list(
        JobListParams(
            queue=queue,
            kinds=chosen,
            states=(JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE),
            limit=DRIVE_SCAN_MAX,
        )
    )
    due = sorted(
        (
            j
            for j in waiting
            if j.state == JobState.AVAILABLE
            or (j.scheduled_at is not None and j.scheduled_at <= now)
        ),
        key=lambda j: (j.scheduled_at or now, j.id),
    )
    for job in due:
        if report.driven + report.missed >= limit:
            report.stopped = "limit"
            break
        if budget is not None and monotonic() - started >= budget.total_seconds():
            report.stopped = "deadline"
            break
        fn = jobs_registry.registry.get(job.kind)
        if not isinstance(fn, ResumableJob):
            report.skipped += 1
            continue
        try:
            outcome = fn.drive(job.id)
        except (JobFenced, JobRunning, JobNotClaimable, NotFound):
            report.skipped += 1
            continue
        except Exception as exc:
            report.errors.append((job.id, f"{type(exc).__name__}: {exc}"))
            report.failed += 1
            continue
        if outcome == "missed":
            report.missed += 1
            after = engine.job_get(job.id)
            why = after.snooze_reason if after is not None else None
            report.warnings.append((job.id, why or "the claim did not begin its pass"))
            continue
        report.driven += 1
        if outcome == "done":
            report.finished += 1
        elif outcome == "canceled":
            report.canceled += 1
        elif outcome == "failed":
            report.failed += 1
            after = engine.job_get(job.id)
            if after is not None and after.errors:
                report.errors.append((job.id, after.errors[-1].error))
    return report


def _positive_int(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidJob(f"{field} must be a positive integer, not {value!r}", field=field)
    return value


def resumable(
    func: Callable[..., Pass | None] | None = None,
    /,
    *,
    queue: str | None = None,
    lease: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    priority: int = 0,
    timeout: float | dt.timedelta | None = None,
    kind: str | None = None,
) -> Any:
    """Declare a resumable job whose function is a pass: ``fn(run, *args, **kwargs)``.

    ``lease`` is the pass lease (seconds or a timedelta; default 5 minutes, at
    least :data:`~django_hopper.validation.PASS_LEASE_MIN`) every pass holds, on
    a worker or driven by ID: it must outlast the longest stretch a pass spends
    between two steps, since each step boundary renews it and a pass that
    stops renewing is taken over once it expires. ``max_attempts`` bounds
    consecutive failed passes.
    """

    if queue is not None:
        validation.queue_name(queue)
    if max_attempts is not None:
        validation.max_attempts(max_attempts)
    lease_td = None if lease is None else validation.pass_lease(lease, "lease")
    timeout_s = jobs._check_timeout(timeout)
    validation.priority(priority)

    def decorate(f: Callable[..., Pass | None]) -> ResumableJob[..., Any]:
        if isinstance(f, JobFunction):
            raise InvalidJob(f"{f.kind} is already a job", field="func")
        name = kind if kind is not None else jobs._importable_kind(f)
        rj: ResumableJob[..., Any] = ResumableJob(
            _PassRunner(f, lease_td or DEFAULT_LEASE),
            lease=lease_td,
            kind=name,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout_s,
            takes_context=True,
            archive=None,
        )
        jobs.register(rj)
        jobs_registry.register_resumable(rj.kind)
        return rj

    if func is not None:
        return decorate(func)
    return decorate


@dataclasses.dataclass(frozen=True, slots=True)
class RunRow:
    """A resumable run as an operator reads it: where its walk stands, or why that
    cannot be read.

    ``decode_error`` names what does not decode, or None (the ordinary case):
    a stored value of the job (``JobRow.decode_error``), or progress that is not
    a committed pass's (``ProgressNotResumable``'s words). The fields it names
    read as empty, and the run is listed all the same.
    """

    id: JobID
    kind: str
    #: What the run walks: its unique key without the ``"<kind>:"`` prefix.
    instance: str | None
    state: str
    #: Consecutive failed passes (a commit sets the attempt back).
    attempt: int
    passes: int
    cursor: JSON
    counters: dict[str, int]
    #: The finishing pass committed.
    done: bool
    subject: str | None
    erased_at: dt.datetime | None
    created_at: dt.datetime
    finalized_at: dt.datetime | None
    decode_error: str | None
    #: The run's job row, as the engine decoded it.
    job: JobRow
    #: Consecutive claims that did not begin their pass (0 once one does, and for
    #: a finished run, whose record says how it ended).
    admission_misses: int = 0
    #: When the pass holding the run BEGAN (None: no pass began under the claim).
    pass_began_at: dt.datetime | None = None
    #: When the lease of the pass holding the run expires (None: no pass lease).
    lease_expires_at: dt.datetime | None = None


def run_row(job: JobRow) -> RunRow:
    """Return the run a job row holds; never raise for what is stored."""
    problems = [job.decode_error] if job.decode_error else []
    cursor: JSON = None
    counters: dict[str, int] = {}
    passes, done = 0, False
    try:
        cursor, counters, passes, done = read_progress(job.progress)
    except ProgressNotResumable as exc:
        problems.append(f"progress: {exc}")
    prefix = f"{job.kind}:"
    key = job.unique_key
    return RunRow(
        id=job.id,
        kind=job.kind,
        instance=key[len(prefix) :] if key and key.startswith(prefix) else None,
        state=job.state,
        attempt=job.attempt,
        passes=passes,
        cursor=cursor,
        counters=counters,
        done=done,
        subject=job.subject,
        erased_at=job.erased_at,
        created_at=job.created_at,
        finalized_at=job.finalized_at,
        decode_error="; ".join(problems) or None,
        job=job,
    )


def list_runs(
    *,
    kinds: str | Iterable[str] | None = None,
    states: str | Iterable[str] | None = None,
    newest_first: bool = False,
    after: JobID | str | None = None,
    limit: int = 100,
) -> list[RunRow]:
    """Return resumable runs, live and finished, in ID (start) order: the operator's read.

    ``kinds`` defaults to every ``@resumable`` kind registered in this process.
    ``after`` is the cursor of the next page (the last ID of a page). A run whose
    stored values or progress do not decode is listed with ``decode_error``
    naming them, never failing the page. A live run carries its admission
    misses and its pass lease (one more statement per page).
    """
    if kinds is None:
        kinds = sorted(k for k, fn in registry.items() if isinstance(fn, ResumableJob))
        if not kinds:
            return []
    jobs_ = list_jobs(
        kinds=kinds, states=states, newest_first=newest_first, after=after, limit=limit
    )
    return with_pass_state([run_row(job) for job in jobs_], get_engine())


def with_pass_state(rows: list[RunRow], engine: BaseEngine) -> list[RunRow]:
    """Return the runs with each live one's admission misses and pass lease.

    One read of the engine for the whole list (none when no run is live), so a
    page of runs costs the same whatever its size.
    """
    live = [r.id for r in rows if r.job.is_live]
    if not live:
        return rows
    passes = {p.id: p for p in engine.job_pass_get_many(JobPassGetManyParams(ids=live))}
    return [
        dataclasses.replace(
            r,
            admission_misses=p.admission_misses,
            pass_began_at=p.began_at,
            lease_expires_at=p.lease_expires_at,
        )
        if (p := passes.get(r.id)) is not None
        else r
        for r in rows
    ]
