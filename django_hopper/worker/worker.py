"""One worker process = one client: it wires the roles together and runs their threads.

Threads of a running worker (each with its own Django connection, closed when
it ends), one module per role:

* one :class:`~django_hopper.worker.producer.Producer` per queue, claiming up
  to its free slots in one ``job_claim``;
* the :class:`~django_hopper.worker.execution.Executor`'s job threads and its
  asyncio thread;
* the :class:`~django_hopper.worker.completer.Completer`, applying results in
  batches;
* the :class:`~django_hopper.worker.heartbeat.Heartbeat`, renewing the client
  lease and applying the control state it returns (cancel requests, paused and
  limited queues);
* the :class:`~django_hopper.worker.notifier.Notifier` (PostgreSQL), turning
  notifications into wake-ups;
* the :class:`~django_hopper.maintenance.leader.Maintainer`, electing a leader
  and running its services.

The roles share one :class:`~django_hopper.worker.control.ControlState`
(lease, paused and limited queues, stop events) instead of reaching into each
other. The worker itself holds the lease registration, the attempts in flight
and the lifecycle; the main thread waits for a stop signal and enforces sync
timeouts.
"""

from __future__ import annotations

import datetime as dt
import functools
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from types import FrameType
from typing import TYPE_CHECKING, Any

from django_hopper import signals
from django_hopper.conf import hopper_settings
from django_hopper.context import JobContext
from django_hopper.engine import get_engine
from django_hopper.engine.params import ClientRegisterParams, JobFinalize
from django_hopper.exceptions import DatabaseUnavailable, UnknownJobKind
from django_hopper.maintenance.leader import Elector, Maintainer
from django_hopper.registry import resolve
from django_hopper.topology import describe, maintenance_alias, session_alias, undeclared_proxy
from django_hopper.worker import execution
from django_hopper.worker.completer import Completer
from django_hopper.worker.control import ControlState
from django_hopper.worker.db import Backoff, close_thread_connections, reset_connection
from django_hopper.worker.declarations import SETUP_DECLARATIONS
from django_hopper.worker.execution import Execution, Executor
from django_hopper.worker.heartbeat import Heartbeat
from django_hopper.worker.notifier import Notifier
from django_hopper.worker.producer import Producer

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JobID, JobRow

logger = logging.getLogger("django_hopper.worker")


#: Jobs claimed ahead per slot when ``HOPPER["CLAIM_AHEAD"]`` is None. Four per
#: slot (Celery's default prefetch multiplier) let a claim carry up to five
#: times the free slots, so that its fixed cost (the statement's start, the
#: commit's WAL flush, the round trip) is shared by several rounds of short jobs;
#: one per slot still left a worker at concurrency 10 waiting on its claims.
AHEAD_PER_SLOT = 4
#: ...and at least enough that a full claim carries this many jobs: at
#: concurrency 10, claims of 50 left one process at about half of a tight loop
#: claiming and finalizing 100 a statement, and claims of 100 closed most of
#: that gap. How long a buffered job may wait bounds it too (the producer's
#: ``AHEAD_FILL``), so a small queue of jobs that are merely short holds few.
AHEAD_MIN_CLAIM = 100


def default_ahead(concurrency: int) -> int:
    """Return the jobs a queue of ``concurrency`` slots claims ahead at most when
    ``HOPPER["CLAIM_AHEAD"]`` is None."""
    return max(AHEAD_PER_SLOT * concurrency, AHEAD_MIN_CLAIM - concurrency)


@dataclass
class WorkerConfig:
    """What a worker does; every field defaults to the HOPPER setting."""

    #: Queue name -> concurrency (how many of its jobs run at once).
    queues: dict[str, int] = field(default_factory=dict)
    burst: bool = False
    shutdown_timeout: float | None = None
    poll_interval: float | None = None
    #: Seconds a wake-up waits after the queue's previous claim (see CLAIM_DEBOUNCE).
    claim_debounce: float | None = None
    client_ttl: float | None = None
    heartbeat_interval: float | None = None
    leader_ttl: float | None = None
    maintenance_interval: float | None = None
    #: Take part in leader election and run the leader's services.
    maintenance: bool = True
    #: Run jobs (False for ``hopper_maintain``).
    run_jobs: bool = True
    #: Once set up, leave the objects alive then (Django, the job modules, the
    #: worker's own) out of the cyclic collector's passes (``gc.freeze``): the
    #: process is the worker's. ``hopper_worker`` sets it; an embedding process
    #: keeps its collector as it is.
    freeze_heap: bool = False

    def __post_init__(self) -> None:
        s = hopper_settings
        if not self.queues and self.run_jobs:
            self.queues = {str(k): int(v) for k, v in dict(s.QUEUES).items()}
        if self.shutdown_timeout is None:
            self.shutdown_timeout = float(s.SHUTDOWN_TIMEOUT)
        if self.poll_interval is None:
            self.poll_interval = float(s.POLL_INTERVAL)
        if self.claim_debounce is None:
            self.claim_debounce = float(s.CLAIM_DEBOUNCE)
        if self.client_ttl is None:
            self.client_ttl = float(s.CLIENT_TTL)
        if self.heartbeat_interval is None:
            self.heartbeat_interval = float(s.HEARTBEAT_INTERVAL)
        if self.leader_ttl is None:
            self.leader_ttl = float(s.LEADER_TTL)
        if self.maintenance_interval is None:
            self.maintenance_interval = float(s.MAINTENANCE_INTERVAL)

    @property
    def concurrency(self) -> int:
        """Return the total number of jobs the worker runs at once."""
        return sum(self.queues.values())


def freeze_heap() -> None:
    """Collect what start-up left as garbage, then move every object still alive
    to the collector's permanent generation (``gc.freeze``).

    A worker's heap is mostly what start-up built: Django, the apps, the job
    modules, hopper's own. The cyclic collector's full passes walk every tracked
    object, with every thread stopped; after the freeze they walk only what
    was made since, so one costs what the jobs' objects cost. Objects made
    after the freeze are collected as before; a frozen one that later becomes
    cyclic garbage stays (start-up's objects live as long as the process).
    """
    gc.collect()
    gc.freeze()


def import_job_modules(modules: list[str] | None = None) -> None:
    """Import the HOPPER["IMPORTS"] modules so that their ``@job`` functions register."""
    for name in modules if modules is not None else list(hopper_settings.IMPORTS):
        import_module(name)


class Worker:
    """One client working its queues. Use as a context manager for ``run_once`` in tests,
    or call :meth:`run` for the normal loop (``--burst`` with ``config.burst``)."""

    def __init__(
        self,
        config: WorkerConfig | None = None,
        engine: BaseEngine | None = None,
        *,
        declarations: Sequence[Callable[[BaseEngine], object]] | None = None,
    ) -> None:

        self.config = config or WorkerConfig()
        self.engine = engine or get_engine()
        #: What setup upserts once the job modules are imported (None: the
        #: registered :data:`~django_hopper.worker.declarations.SETUP_DECLARATIONS`).
        self.declarations = declarations
        self.control = ControlState()
        self.control.cancel = self.cancel_job
        self.producers = {
            q: Producer(
                q,
                c,
                engine=self.engine,
                control=self.control,
                start_job=self.start_job,
                poll_interval=float(self.config.poll_interval or 1.0),
                claim_debounce=float(self.config.claim_debounce or 0),
                ahead=default_ahead(c)
                if hopper_settings.CLAIM_AHEAD is None
                else int(hopper_settings.CLAIM_AHEAD),
                unstarted=self._cancel_unstarted,
            )
            for q, c in self.config.queues.items()
            if c > 0
        }
        self.control.producers = self.producers
        #: The attempts this worker holds, by their job ID's integer (``UUID.int``:
        #: a UUID hashes in Python, an int in C, and this is set and read per job).
        self.executions: dict[int, Execution] = {}
        self._exec_lock = threading.Lock()
        self._signals = 0
        self.completer = Completer(
            self.engine,
            batch_size=int(hopper_settings.COMPLETER_BATCH_SIZE),
            flush_interval=float(hopper_settings.COMPLETER_FLUSH_INTERVAL),
            keep_logs=int(hopper_settings.KEEP_LOGS),
        )
        self.executor = Executor(max(1, self.config.concurrency), self.engine, self._on_done)
        self.maintainer: Maintainer | None = None
        if self.config.maintenance:
            # Through the direct connection when the alias has one (topology).
            direct = maintenance_alias(self.engine.alias)
            session = self.engine if direct == self.engine.alias else get_engine(direct)
            elector = Elector(
                session, lambda: self.control.client_id, float(self.config.leader_ttl or 15)
            )
            self.maintainer = Maintainer(
                session, elector, interval=float(self.config.maintenance_interval or 1)
            )
            self.control.elect = self.maintainer.wake
            self.control.streams = self.maintainer.wake_streams
        self.heartbeat = Heartbeat(
            self.engine,
            self.control,
            register=self.register,
            running=self.running,
            client_ttl=float(self.config.client_ttl or 30),
            interval=float(self.config.heartbeat_interval or 5),
            maintainer=self.maintainer,
            completed=self.completer.completed_unarchived,
        )
        self.notifier = Notifier(self.engine, self.control)
        self._threads: list[threading.Thread] = []
        self._started = False
        #: Attempts still running when the worker stopped (left to the rescue).
        self.stranded = 0

    # -- state shared with the roles (kept on ControlState) -------------------

    @property
    def client_id(self) -> int | None:
        """Return the client lease this worker holds (None before registering)."""
        return self.control.client_id

    @property
    def fenced(self) -> bool:
        """Return whether the lease was refused (claiming stopped until registered again)."""
        return self.control.fenced

    @property
    def stopping(self) -> threading.Event:
        """Return the event set once the worker stops claiming."""
        return self.control.stopping

    @property
    def activity(self) -> threading.Event:
        """Return the event set when a slot frees or the worker stops (the main loop's wake)."""
        return self.control.activity

    # -- lease --------------------------------------------------------------

    def register(self) -> int:
        """Register a client lease and record the queues this worker works.

        Idempotent until the lease is lost, so that a start-up retried after
        a dropped connection does not leave a second lease behind.
        """
        control = self.control
        if control.client_id is not None and not control.fenced:
            return control.client_id
        ttl = dt.timedelta(seconds=float(self.config.client_ttl or 30))
        info = {"pid": os.getpid(), "queues": dict(self.config.queues)}
        control.client_id = self.engine.client_register(
            ClientRegisterParams(hostname=socket.gethostname(), ttl=ttl, info=info)
        )
        self.heartbeat.last_renewed = time.monotonic()
        return control.client_id

    def cancel_job(self, job_id: JobID) -> bool:
        """Cancel a running attempt this worker holds, or a job it claimed ahead and
        has not started; return False if it holds neither."""
        with self._exec_lock:
            ex = self.executions.get(job_id.int)
        if ex is None:
            for producer in self.producers.values():
                job = producer.take_buffered(job_id)
                if job is not None:
                    self._cancel_unstarted(job)
                    return True
            return False
        if ex.context.cancelled:
            return True
        ex.log.info("cancellation requested")
        self.executor.cancel(ex)
        return True

    # -- jobs ---------------------------------------------------------------

    def _cancel_unstarted(self, job: JobRow) -> None:
        """End a job claimed ahead whose cancel was requested before it started.

        Fenced to its claim like any result: if the rescue took the job
        meanwhile, the completer's finalize leaves it alone.
        """
        result = execution.canceled(job, error="canceled before it started")
        execution.job_logger(job).debug("canceled before it started")
        execution.send_signal(
            "job_finished", None, job=job, state=result.state, error=None, output=None
        )
        self.completer.add(job, result)

    def start_job(self, job: JobRow, producer: Producer) -> None:
        """Start a claimed job; snooze or discard one whose kind is unknown here."""
        try:
            fn = resolve(job.kind)
        except UnknownJobKind as exc:
            result = execution.unknown_kind(job, str(exc))
            execution.job_logger(job).debug("%s: %s", result.state, exc)
            execution.send_signal(
                "job_finished", None, job=job, state=result.state, error=exc, output=None
            )
            self.completer.add(job, result)
            producer.release()
            return
        except BaseException as exc:  # the job's module failed to import: a failed attempt
            if isinstance(exc, KeyboardInterrupt) and (
                threading.current_thread() is threading.main_thread()
            ):
                raise  # a real Ctrl-C of a worker run without its signal handlers
            message, trace = execution._format(exc)
            result = execution.failed(job, f"import failed: {message}", trace)
            execution.send_signal(
                "job_finished", None, job=job, state=result.state, error=exc, output=None
            )
            self.completer.add(job, result)
            producer.release()
            return
        timeout = fn.timeout if fn.timeout is not None else float(hopper_settings.JOB_TIMEOUT)
        ex = Execution(
            job=job,
            fn=fn,
            context=JobContext(job, self.engine),
            timeout=timeout if timeout and timeout > 0 else None,
            owner=producer,
        )
        ex.context.completion = functools.partial(execution.complete_now, ex, self.engine)
        with self._exec_lock:
            self.executions[job.id.int] = ex
        if logger.isEnabledFor(logging.DEBUG):  # build the job's logger only then
            ex.log.debug("started")
        self.executor.submit(ex)

    def _on_done(self, ex: Execution, result: JobFinalize | None) -> None:
        """Hand a settled result to the completer (None: decided already) and free the slot.

        The context lets go of its completion (``JobContext.end``), so the
        attempt's objects are freed by their reference counts.
        """
        ex.context.end()
        if result is not None:
            self.completer.add(ex.job, result)
        with self._exec_lock:
            self.executions.pop(ex.job.id.int, None)
        ex.owner.release(time.monotonic() - ex.started)

    def check_deadlines(self) -> None:
        """Fail sync attempts that ran past their timeout.

        A thread cannot be killed: the attempt is finalized as failed now, its
        context is marked cancelled (so a job calling ``check_cancelled()``
        stops), and whatever it returns later is dropped. Its slot stays taken
        until the thread really returns, so the worker never runs more threads
        than its concurrency. Async attempts time out inside their task.
        """
        now = time.monotonic()
        with self._exec_lock:
            overdue = [
                ex
                for ex in self.executions.values()
                if not ex.fn.is_async and ex.deadline is not None and now >= ex.deadline
            ]
        for ex in overdue:
            if ex.settle():
                ex.log.debug("timed out after %gs", ex.timeout)
                ex.context.cancel()
                result = execution.timed_out(ex.job, ex.timeout or 0, ex.context.log_text())
                execution.send_signal(
                    "job_finished",
                    ex.fn,
                    job=ex.job,
                    state=result.state,
                    error=TimeoutError(f"timed out after {ex.timeout:g}s"),
                    output=None,
                )
                self.completer.add(
                    ex.job,
                    execution.fenced_to_claim(ex.context, result),
                    running=ex.code_running,
                )

    def running(self) -> int:
        """Return how many attempts are still executing."""
        with self._exec_lock:
            return len(self.executions)

    # -- lifecycle ----------------------------------------------------------

    def setup(self) -> None:
        """Check the schema, import job modules, sync declarations, register the
        lease, start the threads."""
        if self._started:
            return
        # Refuse a schema this code does not go with before touching any table.
        self.engine.schema_check()
        import_job_modules()
        for declare in SETUP_DECLARATIONS if self.declarations is None else self.declarations:
            declare(self.engine)  # e.g. the subscriptions and consumers the modules declare
        self.register()
        if self.producers:
            self.engine.queue_ensure(list(self.producers))
        # Learn paused and limited queues before the first claim, not a renewal later.
        self.heartbeat.run_once()
        self.completer.start()
        if self.config.run_jobs:
            self.executor.start()
        self._started = True
        # The start line is the console's (django_hopper.observability.console).
        signals.send_logged(signals.worker_started, worker=self)
        # Polling because a transaction pooler leaves no session to LISTEN on is
        # said at WARNING: wake-ups then wait up to a poll interval.
        listens = session_alias(self.engine.alias) is not None
        degraded = not listens and self.engine.features.supports_listen
        logger.log(logging.WARNING if degraded else logging.INFO, "%s", describe(self.engine.alias))
        proxy = undeclared_proxy(self.engine.alias)
        if proxy is not None:
            logger.warning("%s", proxy)

    def __enter__(self) -> Worker:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def run_once(self, timeout: float = 30.0) -> int:
        """Claim once per queue, wait for those attempts and apply their results.

        For tests: deterministic, no polling. Returns how many jobs were claimed.
        """
        self.setup()
        claimed = sum(p.claim_once() for p in self.producers.values())
        self.wait_idle(timeout)
        return claimed

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing runs and every result was applied; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() >= deadline:
                return False
            self.check_deadlines()
            self.activity.wait(0.01)
            self.activity.clear()
        return self.completer.drain(max(deadline - time.monotonic(), 0.1))

    def install_signals(self) -> None:
        """Stop gracefully on the first SIGTERM/SIGINT, at once on the second."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("second signal: stopping at once")
            os._exit(1)
        logger.info(
            "signal %s: stopping (waiting up to %ss for running jobs)",
            signum,
            self.config.shutdown_timeout,
        )
        # Not self.stop() here: the handler runs in the main thread, possibly
        # in the middle of an Event.set() or wait() whose lock is not
        # reentrant, so setting an event from it could deadlock the worker.
        threading.Thread(target=self.stop, name="hopper-stop", daemon=True).start()

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down."""
        self.control.stopping.set()
        self.control.activity.set()
        self.control.wake_all()

    def _maintain(self) -> None:
        if self.maintainer is not None:
            self.maintainer.run(self.stopping)

    def run(self, install_signals: bool = True) -> int:
        """Work until stopped (or, in burst mode, until nothing is left); return an exit code."""
        if install_signals:
            self.install_signals()
        if not self._setup_until_reachable():
            return 0
        if self.config.freeze_heap:
            freeze_heap()
        self._spawn(self.heartbeat.run, "hopper-heartbeat")
        if self.engine.features.supports_listen:
            self._spawn(self.notifier.run, "hopper-notifier")
        if self.maintainer is not None and not self.config.burst:
            self._spawn(self._maintain, "hopper-maintainer")
        try:
            if self.config.burst:
                self._run_burst()
            else:
                for q, p in self.producers.items():
                    thread = threading.Thread(
                        target=p.run, name=f"hopper-producer-{q}", daemon=True
                    )
                    p.thread = thread
                    thread.start()
                while not self.stopping.is_set():
                    self.check_deadlines()
                    self.activity.wait(0.05)
                    self.activity.clear()
        finally:
            self.shutdown()
        return 0

    def _setup_until_reachable(self) -> bool:
        """Set up, retrying while the database is unavailable; False if stopped meanwhile.

        A worker often starts beside a database that is restarting (a deploy,
        a failover) or has its connection cut during start-up; it waits for
        the database as it would mid-run instead of exiting. Any other error
        (missing tables, bad settings) still ends the process at once.
        """
        delay = Backoff(0.1, 5.0)
        while True:
            try:
                self.setup()
                return True
            except DatabaseUnavailable:
                reset_connection(self.engine.alias)
                wait = delay.next()
                logger.warning(
                    "the database is unavailable at start-up; retrying in %.2fs",
                    wait,
                    exc_info=True,
                )
                if self.stopping.wait(wait):
                    return False

    def _run_burst(self) -> None:
        """Claim until no job is claimable and nothing runs, then return.

        A finished job can make another due (a snooze or retry without delay),
        so the worker stops only after a claim round that found nothing,
        started after the last batch of results was applied.
        """
        delay = Backoff(0.1, 2.0)
        while not self.stopping.is_set():
            flushes = self.completer.flushes
            try:
                for p in self.producers.values():
                    p.wait_refill()
                    p.return_stale()
                claimed = sum(p.claim_once() for p in self.producers.values())
                delay.reset()
            except Exception:
                reset_connection(self.engine.alias)
                wait = delay.next()
                logger.warning("claiming failed; retrying in %.2fs", wait, exc_info=True)
                self.stopping.wait(wait)
                continue
            if claimed == 0 and not self.running():
                if self.completer.idle():
                    if self.completer.flushes == flushes and not self.control.fenced:
                        return
                else:
                    # Results still pending may make jobs due again: apply them,
                    # then look once more. (While jobs are claimable, claims do
                    # not wait for the completer: it batches across claims.)
                    self.completer.drain(1.0)
                continue
            self.check_deadlines()
            self.activity.wait(0.05)
            self.activity.clear()

    def shutdown(self) -> None:
        """Stop claiming, wait for running jobs, flush results, resign and delete the lease.

        Jobs still running after the shutdown timeout are left to the rescue:
        deleting the lease makes them rescuable at once.
        """
        if not self._started:
            return
        self._started = False
        self.stop()
        for p in self.producers.values():
            if p.thread is not None:
                p.thread.join(timeout=5)
        # Jobs claimed ahead and not started go back now, attempts given back,
        # so that other workers run them while this one drains its slots.
        for p in self.producers.values():
            p.return_buffer(final=True)
        deadline = time.monotonic() + float(self.config.shutdown_timeout or 0)
        while self.running() and time.monotonic() < deadline:
            self.check_deadlines()
            self.activity.wait(0.05)
            self.activity.clear()
        left = self.running()
        if left:
            logger.warning(
                "%d jobs still running after %ss: leaving them to the rescue",
                left,
                self.config.shutdown_timeout,
            )
        self.completer.stop(timeout=max(float(self.config.shutdown_timeout or 0), 5.0))
        self.control.stopping_hard.set()
        self.control.renew.set()
        if self.maintainer is not None:
            self.maintainer.wake.set()
        for t in self._threads:
            t.join(timeout=5)
        try:
            if self.maintainer is not None and self.control.client_id is not None:
                self.maintainer.elector.resign(self.control.client_id)
            if self.control.client_id is not None:
                self.engine.client_delete(self.control.client_id)
        except Exception:
            logger.warning("resigning or deleting the client lease failed", exc_info=True)
            reset_connection(self.engine.alias)
        self.executor.shutdown(wait=not left)
        self.stranded = left
        # The thread that ran the worker may outlive it (a test, an embedding
        # process): leave no connection of this thread open behind it, unless
        # that thread is inside a transaction of its own.
        if not self.engine.connection.in_atomic_block:
            close_thread_connections()
        signals.send_logged(signals.worker_stopped, worker=self)
