"""The completer: results of attempts, applied in batches.

Results are written with ``job_finalize_many``, one statement per batch,
flushed when ``COMPLETER_BATCH_SIZE`` results wait or ``COMPLETER_FLUSH_INTERVAL``
seconds after the first one arrived. Every result is fenced to its claim, so:

* a result the fence refuses (the job was rescued, or this client was fenced)
  is logged at WARNING and dropped: the job belongs to another claim now;
* a database error while flushing keeps the results and retries with backoff:
  a result that was in fact applied is simply refused the second time;
* the result of an attempt whose code is still running (a sync attempt past
  its timeout) is applied apart, skipping the job's row if a transaction holds
  it: that may be the attempt's own transaction (``JobContext.complete`` or
  progress inside ``atomic()``), and waiting for it would hold up every other
  result. A skipped one is tried again after ``HELD_RETRY`` seconds, and the
  ordinary way once the attempt's code has returned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django_hopper.engine.params import (
    BatchSettleParams,
    JobFinalize,
    JobFinalizeParams,
    WorkflowPromoteParams,
)
from django_hopper.worker.db import (
    Backoff,
    ConnectionWatch,
    close_thread_connections,
    reset_connection,
)
from django_hopper.worker.logs import job_logger

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JobRow

logger = logging.getLogger("django_hopper.worker.completer")

#: Seconds before a result skipped because its row was held is tried again.
HELD_RETRY = 1.0


def settle_finished(engine: BaseEngine, jobs: Sequence[JobRow]) -> None:
    """Promote the dependents and settle the batches of jobs a client just finalized.

    A statement that finalizes a job promotes its dependents and records its
    batch's progress, but two finalized concurrently each miss the other; the
    client that finalized them closes that gap at once (the leader's
    :class:`~django_hopper.maintenance.WorkflowSweeper` sweeps too). On a
    single-writer engine the finalizing transaction did it all already.
    Errors are logged, not raised: the sweep is the backstop.
    """
    done = [j for j in jobs if j.batch_id is not None]
    if not done or engine.features.single_writer:
        return
    try:
        promoted = engine.workflow_promote_ready(
            WorkflowPromoteParams(depends_on=tuple(j.id for j in done))
        )
        batches = {j.batch_id for j in done if j.batch_id is not None} | set(promoted.batches)
        engine.batch_settle(BatchSettleParams(ids=tuple(sorted(batches))))
    except Exception:
        logger.warning(
            "settling the batches of %d finalized jobs failed; the leader's sweep will",
            len(done),
            exc_info=True,
        )


@dataclass(slots=True)
class Result:
    """A result waiting to be applied, with the claim it belongs to."""

    job: JobRow
    finalize: JobFinalize
    #: True while the attempt's code still runs (its transaction may hold the
    #: job's row); None for an attempt that has returned.
    running: Callable[[], bool] | None = None


class Completer:
    """Batches results into ``job_finalize_many`` on a thread of its own."""

    def __init__(
        self,
        engine: BaseEngine,
        *,
        batch_size: int,
        flush_interval: float,
        keep_logs: int,
    ) -> None:
        self.engine = engine
        self.batch_size = max(1, int(batch_size))
        self.flush_interval = max(0.0, float(flush_interval))
        self.keep_logs = int(keep_logs)
        self._pending: list[Result] = []
        #: Results skipped because their row was held, with when to try again.
        self._held: list[tuple[float, Result]] = []
        #: Whether a held row can be skipped without skipping every job: a
        #: single-writer engine would skip them all while anyone writes.
        self._skips_held = engine.features.supports_skip_locked and not (
            engine.features.single_writer
        )
        self._first_at = 0.0
        self._inflight = 0
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stop = False
        self._abort = False
        self._thread: threading.Thread | None = None
        #: How many batches were applied; lets a caller tell whether a flush
        #: happened since it last looked (burst mode).
        self.flushes = 0
        #: Results applied and refused, for tests and stats.
        self.applied = 0
        self.refused = 0
        #: Per applied batch: when, and its completed-but-not-archived jobs per
        #: queue, which history will not count (read by the heartbeat).
        self._unarchived: deque[tuple[float, dict[str, int]]] = deque()

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Start the flushing thread."""
        self._thread = threading.Thread(target=self._run, name="hopper-completer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Flush what is pending (retrying up to ``timeout``) and stop; True if all was applied."""
        drained = self.drain(timeout)
        with self._cond:
            self._stop = True
            self._abort = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return drained

    # -- results ------------------------------------------------------------

    def add(
        self, job: JobRow, finalize: JobFinalize, running: Callable[[], bool] | None = None
    ) -> None:
        """Queue a result for the next batch; ``running`` says whether the attempt's
        code still runs (a sync attempt past its timeout)."""
        with self._lock:  # the condition's own lock, without its Python-level __enter__
            pending = self._pending
            if not pending:
                self._first_at = time.monotonic()
            pending.append(Result(job, finalize, running))
            # Wake the thread only when it has something new to decide: the
            # first result starts the flush timer, a full batch flushes now.
            n = len(pending)
            if n == 1 or n >= self.batch_size:
                self._cond.notify_all()

    def idle(self) -> bool:
        """Return True when no result waits or is being applied."""
        with self._cond:
            return not self._pending and not self._inflight and not self._held

    def drain(self, timeout: float) -> bool:
        """Wait until every queued result was applied (or refused); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._first_at = 0.0  # flush now
            self._cond.notify_all()
            while self._pending or self._inflight or self._held:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    # -- the thread ---------------------------------------------------------

    def _take(self) -> list[Result] | None:
        """Wait for a batch to be due; return it, or None when stopping with nothing left."""
        with self._cond:
            while True:
                held_due = self._release_held(time.monotonic())
                if self._pending:
                    due = self._first_at + self.flush_interval
                    wait = due - time.monotonic()
                    if len(self._pending) >= self.batch_size or wait <= 0 or self._stop:
                        batch = self._pending[: self.batch_size]
                        del self._pending[: self.batch_size]
                        self._first_at = time.monotonic() if self._pending else 0.0
                        self._inflight += len(batch)
                        return batch
                    self._cond.wait(wait)
                elif self._stop:
                    return None
                else:
                    self._cond.wait(0.5 if held_due is None else max(held_due, 0.0))

    def _run(self) -> None:
        try:
            while True:
                batch = self._take()
                if batch is None:
                    return
                try:
                    self._apply(batch)
                finally:
                    with self._cond:
                        self._inflight -= len(batch)
                        self._cond.notify_all()
        finally:
            close_thread_connections()

    def _release_held(self, now: float) -> float | None:
        """Move the held results due by ``now`` back to the pending ones (call with
        the lock held); return the seconds until the next one is due, or None."""
        if not self._held:
            return None
        due = [r for at, r in self._held if at <= now]
        if due:
            self._held = [(at, r) for at, r in self._held if at > now]
            if not self._pending:
                self._first_at = 0.0  # flush now
            self._pending.extend(due)
        if not self._held:
            return None
        return min(at for at, _ in self._held) - now

    def _apply_held(self, batch: list[Result]) -> list[Result]:
        """Apply the results of attempts whose code still runs, skipping held rows;
        return the rest of ``batch``. Skipped ones wait ``HELD_RETRY`` seconds."""
        if not self._skips_held:
            return batch
        running = [r for r in batch if r.running is not None and r.running()]
        if not running:
            return batch
        params = JobFinalizeParams(
            jobs=[r.finalize for r in running],
            no_batches=all(r.job.batch_id is None for r in running),
            keep_logs=self.keep_logs,
            skip_locked=True,
        )
        applied = {(f.id.int, f.fence) for f in self.engine.job_finalize_many(params)}
        done = [r for r in running if (r.finalize.id.int, r.finalize.fence) in applied]
        self.applied += len(done)
        if done and not params.no_batches:
            settle_finished(self.engine, [r.job for r in done])
        # Not applied: its row was held, or its fence refused it. Either way the
        # attempt's code still runs; try again, the ordinary way once it returned.
        settled = {id(r) for r in done}
        again = time.monotonic() + HELD_RETRY
        with self._cond:
            self._held.extend((again, r) for r in running if id(r) not in settled)
        apart = {id(r) for r in running}
        return [r for r in batch if id(r) not in apart]

    def flush_once(self, batch: list[Result]) -> None:
        """Apply one batch now, raising on a database error (the caller retries)."""
        batch = self._apply_held(batch)
        if not batch:
            return
        params = JobFinalizeParams(
            jobs=[r.finalize for r in batch],
            no_batches=all(r.job.batch_id is None for r in batch),
            keep_logs=self.keep_logs,
        )
        # Keyed by the ID's integer: a UUID hashes in Python, an int and a tuple in C.
        applied = {(f.id.int, f.fence) for f in self.engine.job_finalize_many(params)}
        self.flushes += 1
        if not params.no_batches:
            settle_finished(
                self.engine,
                [r.job for r in batch if (r.finalize.id.int, r.finalize.fence) in applied],
            )
        debug = logger.isEnabledFor(logging.DEBUG)
        unarchived: dict[str, int] = {}
        for r in batch:
            if (r.finalize.id.int, r.finalize.fence) in applied:
                self.applied += 1
                if r.finalize.state == "completed" and not r.finalize.archive:
                    unarchived[r.job.queue] = unarchived.get(r.job.queue, 0) + 1
                if debug:
                    job_logger(r.job, logger).debug("finalized as %s", r.finalize.state)
            else:
                self.refused += 1
                job_logger(r.job, logger).warning(
                    "result %s refused by the fence: the attempt no longer owns the job "
                    "(it was rescued, or this worker's lease expired); dropped",
                    r.finalize.state,
                )

        if unarchived:
            with self._cond:
                self._unarchived.append((time.monotonic(), unarchived))

    def completed_unarchived(self, window: float = 60.0) -> dict[str, int]:
        """Return the jobs completed without archiving in the last ``window`` seconds, per queue.

        ``stats`` counts completions from history; the heartbeat reports these
        so a job deleted at completion is counted too, with no write per job.
        """
        horizon = time.monotonic() - window
        out: dict[str, int] = {}
        with self._cond:
            while self._unarchived and self._unarchived[0][0] < horizon:
                self._unarchived.popleft()
            for _, counts in self._unarchived:
                for queue, n in counts.items():
                    out[queue] = out.get(queue, 0) + n
        return out

    def _apply(self, batch: list[Result]) -> None:
        delay = Backoff(0.05, 5.0)
        watch = ConnectionWatch(f"applying {len(batch)} results")
        while True:
            try:
                self.flush_once(batch)
                watch.ok()
                return
            except Exception as exc:
                watch.failed(exc)
                reset_connection(self.engine.alias)
                with self._cond:
                    if self._abort:
                        logger.error(
                            "stopping with %d results unapplied; the rescue will retry their jobs",
                            len(batch),
                        )
                        return
                wait = delay.next()
                with self._cond:
                    self._cond.wait_for(lambda: self._abort, timeout=wait)
