"""Running one attempt and turning how it ended into a result.

The executor runs sync job functions in a thread pool and ``async def`` ones on
one event loop in a dedicated thread. Whatever happens, an attempt produces
exactly one :class:`~django_hopper.engine.params.JobFinalize` (or none, if the
worker already settled it, e.g. on a timeout), which goes to the completer.

Outcomes (one function each, so the rules live in one place):

* return value -> ``completed`` with the value as output; a value that is not
  JSON fails the attempt with a clear error;
* exception -> ``retryable`` after :func:`django_hopper.retry.backoff`, or
  ``discarded`` once ``attempt >= max_attempts``. Any ``BaseException`` the
  job raises counts (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``,
  a custom one): job code runs on the executor's threads, which a shutdown
  signal never interrupts (the worker handles SIGTERM/SIGINT itself, on the
  main thread), so whatever reaches them came from the job and ends only its
  attempt;
* :class:`~django_hopper.context.JobSnooze` -> ``scheduled`` with the attempt given back;
* cancellation -> ``canceled``;
* unknown kind -> snoozed with a doubling wait while the job is younger than
  ``HOPPER["UNKNOWN_KIND_GRACE"]`` (a rolling deploy: another worker knows
  it), then ``discarded`` with the reason;
* timeout -> a failure ``timed out after Ns``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections, transaction

from django_hopper import signals, validation
from django_hopper.conf import hopper_settings
from django_hopper.context import AttemptSettled, JobContext, JobDiscard, JobSnooze
from django_hopper.engine.params import JobFinalize, JobFinalizeParams
from django_hopper.engine.rules import attempt_error
from django_hopper.exceptions import InvalidJob, JobCanceled, JobFenced
from django_hopper.retry import backoff
from django_hopper.types import JobState, RescueReason
from django_hopper.worker.completer import settle_finished
from django_hopper.worker.db import close_thread_connections
from django_hopper.worker.logs import JobLogger, job_logger
from django_hopper.worker.logs import logger as _logger

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.jobs import JobFunction
    from django_hopper.types import AttemptError, JobRow


# ---------------------------------------------------------------------------
# Outcomes


def _archive(fn: JobFunction[Any, Any] | None) -> bool:

    if fn is not None and fn.archive is not None:
        return bool(fn.archive)
    return bool(hopper_settings.ARCHIVE_COMPLETED)


def completed(
    job: JobRow, output: Any, log: str | None = None, fn: JobFunction[Any, Any] | None = None
) -> JobFinalize:
    """Return the result of an attempt that returned ``output``."""
    return JobFinalize(
        id=job.id,
        attempted_by=job.attempted_by,
        fence=job.fence,
        state=JobState.COMPLETED,
        output=output,
        log=log,
        archive=_archive(fn),
    )


def _ended(
    job: JobRow,
    state: str,
    err: AttemptError,
    log: str | None = None,
    delay: dt.timedelta = dt.timedelta(0),
) -> JobFinalize:
    """Return the result of an attempt that ended in ``state`` with ``err``,
    fenced to the attempt's claim (its client and fence)."""
    return JobFinalize(
        id=job.id,
        attempted_by=job.attempted_by,
        fence=job.fence,
        state=state,
        delay=delay,
        error=err,
        log=log,
    )


def failed(
    job: JobRow, error: str, trace: str = "", log: str | None = None, rescue: str = ""
) -> JobFinalize:
    """Return a failed attempt's result: retry after backoff, or discard when out of attempts."""
    err = attempt_error(job, error, trace=trace, rescue=rescue, by=job.attempted_by)
    if job.attempt >= job.max_attempts:
        return _ended(job, JobState.DISCARDED, err, log)
    return _ended(job, JobState.RETRYABLE, err, log, delay=backoff(job.attempt))


def discarded(job: JobRow, error: str, trace: str = "", log: str | None = None) -> JobFinalize:
    """Return the result of an attempt that raised JobDiscard: discarded now."""
    err = attempt_error(job, error, trace=trace, by=job.attempted_by)
    return _ended(job, JobState.DISCARDED, err, log)


def snoozed(job: JobRow, snooze: JobSnooze, log: str | None = None) -> JobFinalize:
    """Return the result of an attempt that snoozed: scheduled again, attempt given back."""
    return JobFinalize(
        id=job.id,
        attempted_by=job.attempted_by,
        fence=job.fence,
        state=JobState.SCHEDULED,
        delay=snooze.delay,
        snooze=True,
        snooze_reason=snooze.reason or None,
        log=log,
    )


def canceled(job: JobRow, log: str | None = None, error: str = "canceled") -> JobFinalize:
    """Return the result of an attempt that stopped because its cancellation was requested."""
    err = attempt_error(job, error, rescue=RescueReason.CANCELED, by=job.attempted_by)
    return _ended(job, JobState.CANCELED, err, log)


#: The longest wait between two tries of a job whose kind is unknown (seconds).
UNKNOWN_KIND_MAX_DELAY = 60.0


def unknown_kind(job: JobRow, error: str) -> JobFinalize:
    """Return the result for a job whose kind this worker cannot resolve.

    During a rolling deploy a worker of the previous release meets the kinds
    the new release enqueues: the job is snoozed (its attempt given back, the
    reason recorded) so that a worker that knows the kind runs it. The wait
    doubles with the job's age (1 s, 2 s, 4 s ... at most a minute), and once
    the job is ``HOPPER["UNKNOWN_KIND_GRACE"]`` seconds old (enqueue to this
    claim, both database times) it is discarded with the reason: a kind no
    worker knows by then is a mistake a job retried forever would hide.
    """
    grace = float(hopper_settings.UNKNOWN_KIND_GRACE)
    age = (
        (job.attempted_at - job.created_at).total_seconds() if job.attempted_at is not None else 0.0
    )
    if age < grace:
        delay = min(max(age, 1.0), UNKNOWN_KIND_MAX_DELAY, grace - age)
        return JobFinalize(
            id=job.id,
            attempted_by=job.attempted_by,
            fence=job.fence,
            state=JobState.SCHEDULED,
            delay=dt.timedelta(seconds=delay),
            snooze=True,
            snooze_reason=f"{error}; tried again for {grace:g}s after enqueue",
        )
    if grace > 0:
        error = f"{error}; no worker that claimed it knew the kind within {grace:g}s of enqueue"
    return _ended(job, JobState.DISCARDED, attempt_error(job, error, by=job.attempted_by))


def timed_out(job: JobRow, timeout: float, log: str | None = None) -> JobFinalize:
    """Return the result of an attempt that ran past its timeout."""
    return failed(job, f"timed out after {timeout:g}s", log=log)


def _json_error(output: Any) -> str | None:
    """Return why ``output`` cannot be stored as JSON, or None if it can."""
    if output is None or type(output) in (int, bool):  # most jobs: nothing to check
        return None
    if type(output) is str and "\x00" not in output:
        return None
    try:
        dumped = json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"the job returned a value that is not JSON ({type(output).__name__}): {exc}"
    if "\\u0000" in dumped:  # a NUL somewhere (rare): the JSON rule says where
        try:
            validation.json_normalize(output, "the job's return value")
        except InvalidJob as exc:
            return str(exc)
    return None


def _format(exc: BaseException) -> tuple[str, str]:
    """Return an exception's one-line error and its traceback."""
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return message, trace


def _call_args(job: JobRow) -> tuple[list[Any], dict[str, Any]]:
    stored = job.args if isinstance(job.args, dict) else {}
    return list(stored.get("args") or []), dict(stored.get("kwargs") or {})


def complete_now(ex: Execution, engine: BaseEngine, output: Any) -> None:
    """Complete ``ex``'s attempt in the caller's transaction (``JobContext.complete``).

    The statement the completer would run, fenced to the attempt's claim (or
    its pass lease); once the caller's transaction commits the attempt is
    settled, and the worker writes no result for it. JobFenced, writing
    nothing, when the claim lost the job.
    """
    ctx = ex.context
    result = fenced_to_claim(ctx, completed(ex.job, output, ctx.log_text(), ex.fn))
    applied = engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[result],
            no_batches=ex.job.batch_id is None,
            keep_logs=int(hopper_settings.KEEP_LOGS),
        )
    )
    if not applied:
        ctx.lost_claim()
        raise JobFenced(f"job {ex.job.id} is no longer owned by this attempt; not completed")

    def settled() -> None:
        ex.settled_state = JobState.COMPLETED
        settle_finished(engine, [ex.job])

    transaction.on_commit(settled, using=engine.alias)


def fenced_to_claim(context: JobContext, result: JobFinalize) -> JobFinalize:
    """Return ``result`` fenced to the job lease that owns the attempt, if one does.

    A resumable pass that BEGAN holds a pass lease: from then on its writes,
    its result included, are fenced to that lease rather than to the client.
    """
    token = context.lease_token
    if token is None or result.lease_token is not None:
        return result
    return dataclasses.replace(result, attempted_by=None, lease_token=token)


# ---------------------------------------------------------------------------
# Signals (sent robustly: a receiver's bug must not break the worker)


def send_signal(name: str, sender: Any, **kwargs: Any) -> None:
    """Send ``django_hopper.signals.<name>``; log receiver errors instead of failing the job."""
    signals.send_logged(getattr(signals, name), sender, **kwargs)


async def in_sync_context(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``func`` from an ``async def`` attempt the way Django calls sync code from async.

    Signal receivers are ordinary sync code: one that touches the ORM raises
    ``SynchronousOnlyOperation`` on the worker's event loop. This runs ``func``
    in asgiref's thread for sync code (``sync_to_async(thread_sensitive=True)``,
    the thread an async job's own ``sync_to_async`` calls use), with Django's
    per-request connection hygiene around it, as for a sync attempt.
    """

    def call() -> Any:
        _close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            _close_old_connections()

    return await sync_to_async(call, thread_sensitive=True)()


def _close_old_connections() -> None:
    """Django's per-request ``close_old_connections``, skipped when this thread has none.

    A job thread that never touched the database has nothing to check; the
    check of every alias costs more than a no-op job itself.
    """
    storage = getattr(connections._connections, "_storage", None)
    if isinstance(storage, threading.local) and not vars(storage):
        return
    close_old_connections()


# ---------------------------------------------------------------------------
# Executions


@dataclass(eq=False)
class Execution:
    """One attempt this worker holds: the claim, its context and how it runs."""

    job: JobRow
    fn: JobFunction[Any, Any]
    context: JobContext
    #: Seconds the attempt may run, or None.
    timeout: float | None
    started: float = field(default_factory=time.monotonic)
    #: Set once the attempt's result is decided (by the attempt, or by a timeout).
    settled: bool = False
    #: Set once the code of the attempt has returned (its thread or task ended).
    returned: bool = False
    task: asyncio.Task[Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The producer whose slot the attempt holds.
    owner: Any = None
    #: What the attempt raised, if anything (for ``job_finished``).
    exception: BaseException | None = None
    #: The state an attempt that ended itself (AttemptSettled) left its job in.
    settled_state: str = ""
    _log: JobLogger | None = field(default=None, init=False, repr=False)
    _done: threading.Event | None = field(default=None, init=False, repr=False)

    @property
    def done(self) -> threading.Event:
        """Return an event set once the code of the attempt has returned.

        Built on first use: only a caller that waits for a stray thread needs
        one, and an Event costs a Condition per job.
        """
        with self.lock:
            if self._done is None:
                self._done = threading.Event()
                if self.returned:
                    self._done.set()
            return self._done

    def code_running(self) -> bool:
        """Return whether the code of the attempt still runs (it may hold the job's row)."""
        return not self.returned

    def mark_returned(self) -> None:
        """Record that the code of the attempt has returned (and wake whoever waits)."""
        with self.lock:
            self.returned = True
            done = self._done
        if done is not None:
            done.set()

    @property
    def log(self) -> JobLogger:
        """Return the attempt's logger, built on first use (most attempts log nothing)."""
        log = self._log
        if log is None:
            log = self._log = job_logger(self.job)
        return log

    @property
    def deadline(self) -> float | None:
        """Return the monotonic time at which the attempt times out, or None."""
        return None if self.timeout is None else self.started + self.timeout

    def settle(self) -> bool:
        """Claim the right to decide the result; True for the first caller only."""
        with self.lock:
            if self.settled:
                return False
            self.settled = True
            return True

    def return_and_settle(self) -> bool:
        """Record that the code returned and claim the result, under one lock
        (the end of every attempt); True unless the timeout decided it first."""
        with self.lock:
            self.returned = True
            done = self._done
            first = not self.settled
            self.settled = True
        if done is not None:
            done.set()
        return first


#: Called with the execution and its result, already settled by the executor
#: (None when the result was decided elsewhere, by the timeout).
DoneCallback = Callable[[Execution, JobFinalize | None], None]


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close a stopped event loop (from its own thread): its selector and self-pipe
    are file descriptors, left open otherwise with a ``ResourceWarning``.

    Async generators get their ``aclose()`` and the default executor's threads
    end first, as ``asyncio.run`` does. Tasks still pending (attempts left to
    the rescue at a shutdown timeout) are dropped with the loop.
    """
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    except BaseException:
        _logger.warning("shutting the event loop down failed", exc_info=True)
    finally:
        loop.close()


#: Put on the job queue to end one job thread.
_STOP = None


class Executor:
    """Runs attempts: sync functions on fixed job threads, async functions on one event loop.

    The job threads read attempts from one queue; a worker never queues more
    attempts than it has threads (it claims at most its free slots), so an
    attempt starts as soon as it is queued.
    """

    def __init__(self, threads: int, engine: BaseEngine, on_done: DoneCallback) -> None:
        self.threads = max(1, threads)
        self.engine = engine
        self.on_done = on_done
        self._queue: queue.SimpleQueue[Execution | None] = queue.SimpleQueue()
        self._job_threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Start the job threads and the event loop thread."""
        for i in range(self.threads):
            thread = threading.Thread(target=self._job_thread, name=f"hopper-job_{i}", daemon=True)
            thread.start()
            self._job_threads.append(thread)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._run_loop, name="hopper-asyncio", daemon=True
        )
        self._loop_thread.start()

    def _job_thread(self) -> None:
        get = self._queue.get
        run = self._run_sync
        try:
            while True:
                ex = get()
                if ex is _STOP:
                    return
                try:
                    run(ex)
                except BaseException:  # pragma: no cover - _run_sync handles the job's errors
                    _logger.exception("a job thread failed")
        finally:
            close_thread_connections()

    def _run_loop(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            while True:
                try:
                    self._loop.run_forever()
                    break  # stopped by shutdown()
                except BaseException:
                    # asyncio re-raises a KeyboardInterrupt or SystemExit of any
                    # task (a child task a job started, too) out of the loop. The
                    # task's awaiter sees it and fails its own attempt; the loop
                    # goes on running the other attempts.
                    _logger.warning(
                        "a job's task raised out of the event loop; the loop goes on",
                        exc_info=True,
                    )
            _close_loop(self._loop)
        finally:
            close_thread_connections()

    def shutdown(self, wait: bool) -> None:
        """Stop the job threads and the loop; with ``wait``, wait for them to end.

        Each job thread closes its connections when it ends. Without ``wait``,
        attempts still queued are dropped (their jobs are left to the rescue).
        """
        if not wait:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
        for _ in self._job_threads:
            self._queue.put(_STOP)
        if wait:
            for thread in self._job_threads:
                thread.join(timeout=5)
        self._job_threads = []
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if wait and self._loop_thread is not None:
                self._loop_thread.join(timeout=5)

    # -- running ------------------------------------------------------------

    def submit(self, ex: Execution) -> None:
        """Start an attempt."""
        if ex.fn.is_async:
            assert self._loop is not None
            asyncio.run_coroutine_threadsafe(self._run_async(ex), self._loop)
        else:
            self._queue.put(ex)

    def cancel(self, ex: Execution) -> None:
        """Ask an attempt to stop: set its context's flag, and cancel its asyncio task."""
        ex.context.cancel()
        if ex.fn.is_async and self._loop is not None:
            with ex.lock:
                task = ex.task
            if task is not None:
                self._loop.call_soon_threadsafe(task.cancel)

    def _finish(self, ex: Execution, result: JobFinalize | None) -> None:
        """Decide the attempt's result (unless its timeout did first) and hand it on.

        ``job_finished`` is sent for the result that counts: a late result of
        an attempt that timed out is dropped, and its ending was announced
        by the worker when the timeout decided it. ``result`` is None for an
        attempt that ended itself (:class:`AttemptSettled`): nothing to write.
        A result is fenced to the job lease that owns the attempt, if one does.
        """
        state = result.state if result is not None else ex.settled_state
        if ex.return_and_settle():
            if signals.job_finished.receivers:
                signals.send_positional(
                    signals.job_finished,
                    ex.fn,
                    ex.job,
                    state,
                    ex.exception,
                    result.output if result and result.state == JobState.COMPLETED else None,
                )
            decided = None if result is None else fenced_to_claim(ex.context, result)
        else:
            ex.log.warning(
                "late result %s dropped: the attempt was already finalized (timed out)", state
            )
            decided = None
        try:
            self.on_done(ex, decided)
        except Exception:
            ex.log.exception("handing the result to the completer failed")

    def _run_sync(self, ex: Execution) -> None:
        _close_old_connections()
        try:
            result = self._call_sync(ex)
        finally:
            _close_old_connections()
        self._finish(ex, result)

    def _call_sync(self, ex: Execution) -> JobFinalize | None:
        job, ctx = ex.job, ex.context
        args, kwargs = _call_args(job)
        try:
            if signals.job_started.receivers:
                signals.send_positional(signals.job_started, ex.fn, job)
            if ex.fn.takes_context:
                output = ex.fn.func(ctx, *args, **kwargs)
            else:
                output = ex.fn.func(*args, **kwargs)
        except BaseException as exc:  # whatever the job raises ends its attempt, not the worker
            return _error_outcome(ex, exc)
        return _output_outcome(ex, output)

    async def _run_async(self, ex: Execution) -> None:
        with ex.lock:
            ex.task = asyncio.current_task()
        result = await self._call_async(ex)
        if signals.job_finished.receivers:
            # _finish sends job_finished: in sync context, never on the loop.
            await asyncio.shield(in_sync_context(self._finish, ex, result))
        else:
            self._finish(ex, result)

    async def _call_async(self, ex: Execution) -> JobFinalize | None:
        job, ctx = ex.job, ex.context
        args, kwargs = _call_args(job)
        timeout_cm = asyncio.timeout(ex.timeout)
        try:
            if ctx.cancelled:  # cancelled before the task existed
                raise asyncio.CancelledError
            if signals.job_started.receivers:
                await in_sync_context(send_signal, "job_started", ex.fn, job=job)
            async with timeout_cm:
                if ex.fn.takes_context:
                    output = await ex.fn.func(ctx, *args, **kwargs)
                else:
                    output = await ex.fn.func(*args, **kwargs)
        except TimeoutError as exc:
            ex.exception = exc
            if timeout_cm.expired():
                return timed_out(job, ex.timeout or 0, ctx.log_text())
            message, trace = _format(exc)
            return failed(job, message, trace, ctx.log_text())
        except asyncio.CancelledError as exc:
            ex.exception = exc
            return canceled(job, ctx.log_text())
        except BaseException as exc:  # KeyboardInterrupt would otherwise stop the event loop
            return _error_outcome(ex, exc)
        return _output_outcome(ex, output)


def _error_outcome(ex: Execution, exc: BaseException) -> JobFinalize | None:
    """Turn what an attempt raised into its result: the one rule for sync and async jobs.

    None: the attempt ended itself (:class:`AttemptSettled`), and writes no result.
    """
    job, ctx = ex.job, ex.context
    if isinstance(exc, AttemptSettled):
        ex.settled_state = exc.state
        return None
    if ex.settled_state:
        ex.log.warning("raised after it completed itself (ignored): %r", exc)
        return None
    if isinstance(exc, JobSnooze):
        return snoozed(job, exc, ctx.log_text())
    ex.exception = exc
    if isinstance(exc, JobCanceled):
        return canceled(job, ctx.log_text())
    if isinstance(exc, JobFenced):
        return failed(job, f"JobFenced: {exc}", log=ctx.log_text())
    if ctx.cancelled:
        return canceled(job, ctx.log_text())
    message, trace = _format(exc)
    if isinstance(exc, JobDiscard):
        return discarded(job, message, trace, ctx.log_text())
    if ex.log.isEnabledFor(logging.DEBUG):
        ex.log.debug("attempt failed: %s", message)
    return failed(job, message, trace, ctx.log_text())


def _output_outcome(ex: Execution, output: Any) -> JobFinalize | None:
    """Complete the attempt with its return value, which must be JSON (None: the
    attempt completed itself in its transaction, ``JobContext.complete``)."""
    if ex.settled_state:
        return None
    problem = _json_error(output)
    if problem is not None:
        return failed(ex.job, problem, log=ex.context.log_text())
    return completed(ex.job, output, ex.context.log_text(), ex.fn)
