"""One worker process = one client: producers, executor, completer, heartbeat, notifier.

Threads of a running worker (each with its own Django connection, closed when
it ends):

* one producer per queue, claiming up to its free slots in one ``job_claim``;
* the executor's job threads and its asyncio thread;
* the completer, applying results in batches;
* the heartbeat, renewing the client lease and applying the control state it
  returns (cancel requests, paused and limited queues);
* the notifier (PostgreSQL), turning notifications into wake-ups;
* the maintainer, electing a leader and running its services.

The main thread waits for a stop signal and enforces sync timeouts.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from importlib import import_module
from types import FrameType
from typing import TYPE_CHECKING, Any

from django_hopper import signals
from django_hopper.conf import hopper_settings
from django_hopper.context import JobContext
from django_hopper.engine.params import (
    ClientRegisterParams,
    ClientRenewParams,
    JobClaimParams,
    JobFinalize,
)
from django_hopper.exceptions import DatabaseUnavailable, NotSupported, UnknownJobKind
from django_hopper.maintenance.leader import Elector, Maintainer
from django_hopper.topology import describe, maintenance_alias, session_alias, undeclared_proxy
from django_hopper.types import (
    CHANNEL_CONTROL,
    CHANNEL_INSERT,
    CHANNEL_LEADER,
    ControlAction,
    ControlMessage,
)
from django_hopper.worker import execution
from django_hopper.worker.completer import Completer
from django_hopper.worker.db import Backoff, close_thread_connections, reset_connection
from django_hopper.worker.execution import Execution, Executor

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JobID, JobRow, Notification

logger = logging.getLogger("django_hopper.worker")


def _debug() -> bool:
    """Return whether job DEBUG lines are emitted (build their loggers only then)."""
    return logger.isEnabledFor(logging.DEBUG)


#: After a claim that filled every free slot (more work is likely waiting),
#: claim again once this fraction of the queue's concurrency is free, so that
#: each claim carries several jobs instead of one per finished job...
REFILL = 0.5
#: ...but never leave a freed slot idle longer than this many seconds.
REFILL_WAIT = 0.002


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


def import_job_modules(modules: list[str] | None = None) -> None:
    """Import the HOPPER["IMPORTS"] modules so that their ``@job`` functions register."""
    for name in modules if modules is not None else list(hopper_settings.IMPORTS):
        import_module(name)


class Producer:
    """Claims jobs of one queue, up to its free slots, when woken or when the poll fires."""

    def __init__(self, worker: Worker, queue: str, concurrency: int) -> None:
        self.worker = worker
        self.queue = queue
        self.concurrency = concurrency
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self.running = 0
        #: The last claim filled every free slot: there may be more work.
        self.full = False
        #: Free slots to wait for after a full claim before claiming again.
        self.refill = max(1, min(concurrency, int(concurrency * REFILL)))
        #: Monotonic time before which the rate limit allows nothing.
        self.hold_until = 0.0
        #: Monotonic time the latest claim started (for the debounce).
        self.last_claim = 0.0
        self.claims = 0
        #: Jobs claimed in all, and by the latest claim (read by the metrics).
        self.claimed = 0
        self.last_batch = 0
        self.thread: threading.Thread | None = None

    def free(self) -> int:
        """Return how many more jobs this queue may run now."""
        with self._lock:
            return self.concurrency - self.running

    def wait_refill(self) -> None:
        """After a full claim, give more slots up to REFILL_WAIT to free before claiming.

        A claim has a fixed cost, so it should carry several jobs rather than
        the one slot that just freed; :meth:`release` ends the wait as soon as
        :attr:`refill` slots are free. Call right before a claim.
        """
        if self.full and self.free() < self.refill:
            self.wake.clear()
            if self.free() < self.refill:
                self.wake.wait(REFILL_WAIT)
            self.wake.clear()  # the claim that follows covers whatever woke us

    def release(self) -> None:
        """Free a slot; wake the producer if the queue may hold more work."""
        with self._lock:
            self.running -= 1
            free = self.concurrency - self.running
        if self.full and (free == 1 or free >= self.refill):
            # The first freed slot starts the refill wait; enough free slots end it.
            self.wake.set()
            self.worker.activity.set()
        elif free >= self.concurrency:
            self.worker.activity.set()  # idle now: burst mode and wait_idle look again

    def claim_once(self) -> int:
        """Claim up to the free slots in one call and start the jobs; return how many."""
        w = self.worker
        if not w.may_claim() or self.queue in w.paused_queues:
            return 0
        if time.monotonic() < self.hold_until:
            return 0
        free = self.free()
        if free <= 0 or w.client_id is None:
            return 0
        self.last_claim = time.monotonic()
        result = w.engine.job_claim(
            JobClaimParams(
                queue=self.queue,
                client_id=w.client_id,
                limit=free,
                limited=self.queue in w.limited_queues,
            )
        )
        self.claims += 1
        self.claimed += len(result.jobs)
        self.last_batch = len(result.jobs)
        if result.wait > dt.timedelta(0):
            self.hold_until = time.monotonic() + result.wait.total_seconds()
        self.full = len(result.jobs) >= free
        if result.jobs:
            with self._lock:
                self.running += len(result.jobs)
            for job in result.jobs:
                w.start_job(job, self)
        return len(result.jobs)

    def debounce(self) -> None:
        """Hold a wake-up that follows the previous claim closely; call before a claim.

        Leading edge: a wake-up long after the last claim (an idle queue's
        first insert) claims at once, so pickup latency is not taxed. One
        within ``claim_debounce`` of it (a burst of inserts, each notifying)
        waits for the rest of the interval, and every wake-up that arrives
        meanwhile is covered by the one claim that follows. After a full
        claim the refill wait governs instead: work is known to be waiting.
        """
        window = float(self.worker.config.claim_debounce or 0)
        if window <= 0 or self.full:
            return
        rest = self.last_claim + window - time.monotonic()
        if rest > 0:
            self.worker.stopping.wait(rest)
            self.wake.clear()  # the claim that follows covers them

    def run(self) -> None:
        """Claim when woken (notification, freed slot) or when the poll interval passes."""
        w = self.worker
        poll = float(w.config.poll_interval or 1.0)
        delay = Backoff(0.1, 5.0)
        failing_since: float | None = None
        self.wake.set()  # claim at start
        try:
            while not w.stopping.is_set():
                woken = self.wake.wait(poll)
                if w.stopping.is_set():
                    break
                self.wake.clear()
                if woken:
                    self.debounce()
                    self.wait_refill()
                hold = self.hold_until - time.monotonic()
                if hold > 0:
                    w.stopping.wait(min(hold, poll))
                try:
                    self.claim_once()
                    delay.reset()
                    if failing_since is not None:
                        logger.warning(
                            "claiming from queue %s again after %.1fs of failures",
                            self.queue,
                            time.monotonic() - failing_since,
                        )
                        failing_since = None
                except Exception:
                    reset_connection(w.engine.alias)
                    if failing_since is None:
                        failing_since = time.monotonic()
                    wait = delay.next()
                    logger.warning(
                        "claiming from queue %s failed; retrying in %.2fs",
                        self.queue,
                        wait,
                        exc_info=True,
                    )
                    w.stopping.wait(wait)
                    self.wake.set()
        finally:
            close_thread_connections()


class Heartbeat:
    """Renews the client lease and applies the control state the renewal returns."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.wake = threading.Event()
        self.last_renewed = time.monotonic()

    def run_once(self) -> bool:
        """Renew once; return whether the lease was renewed.

        A renewal that says ``renewed=False`` means the lease had expired and
        the rescue may already have taken this client's jobs: the worker is
        fenced. While fenced, each run waits for the running jobs to end and
        then registers a new lease, so the process works again.
        """
        w = self.worker
        if w.fenced:
            if not w.executions:
                w.register()
                w.fenced = False
                logger.warning("registered again as client %s after being fenced", w.client_id)
            return False
        if w.client_id is None:
            return False
        ttl = dt.timedelta(seconds=float(w.config.client_ttl or 30))
        result = w.engine.client_renew(ClientRenewParams(client_id=w.client_id, ttl=ttl))
        if not result.renewed:
            w.on_fenced()
            return False
        self.last_renewed = time.monotonic()
        w.suspended = False
        w.apply_control(result.cancel_requested, result.paused_queues, result.limited_queues)
        if w.maintainer is not None:
            w.maintainer.register()
        return True

    def run(self) -> None:
        """Renew every HEARTBEAT_INTERVAL; stop claiming while the lease may have expired."""
        w = self.worker
        interval = float(w.config.heartbeat_interval or 5)
        ttl = float(w.config.client_ttl or 30)
        delay = Backoff(0.1, max(interval / 2, 0.1))
        try:
            while not w.stopping_hard.is_set():
                try:
                    self.run_once()
                    delay.reset()
                    wait = interval
                except Exception:
                    reset_connection(w.engine.alias)
                    wait = min(delay.next(), interval)
                    if time.monotonic() - self.last_renewed > ttl and not w.suspended:
                        w.suspended = True
                        logger.error("client lease not renewed for %.1fs: claiming paused", ttl)
                    logger.warning("renewing the client lease failed", exc_info=True)
                self.wake.wait(wait)
                self.wake.clear()
        finally:
            close_thread_connections()


class Notifier:
    """Turns notifications into wake-ups (engines with ``supports_listen``).

    Reconnects with backoff when the listening connection breaks, and wakes
    every producer after reconnecting, since notifications sent meanwhile
    were lost.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def dispatch(self, note: Notification) -> None:
        """Act on one notification."""
        w = self.worker
        if note.channel == CHANNEL_INSERT:
            producer = w.producers.get(note.payload)
            if producer is not None:
                producer.wake.set()
        elif note.channel == CHANNEL_CONTROL:
            w.on_control(note.payload)
        elif note.channel == CHANNEL_LEADER and w.maintainer is not None:
            w.maintainer.wake.set()

    def run(self) -> None:
        """Listen until the worker stops."""
        w = self.worker
        delay = Backoff(0.1, 5.0)
        first = True
        try:
            while not w.stopping_hard.is_set():
                listener = None
                try:
                    try:
                        listener = w.engine.listener()
                    except NotSupported:
                        return  # no session for LISTEN (a transaction pooler): poll
                    listener.listen([CHANNEL_INSERT, CHANNEL_CONTROL, CHANNEL_LEADER])
                    if not first:
                        logger.info("listening again")
                        w.wake_all()
                    first = False
                    delay.reset()
                    while not w.stopping_hard.is_set():
                        for note in listener.next(0.5):
                            self.dispatch(note)
                except Exception:
                    wait = delay.next()
                    logger.warning(
                        "listening for notifications failed; reconnecting in %.2fs",
                        wait,
                        exc_info=True,
                    )
                    w.stopping_hard.wait(wait)
                finally:
                    if listener is not None:
                        try:
                            listener.close()
                        except Exception:
                            logger.debug("closing the listener failed", exc_info=True)
        finally:
            close_thread_connections()


class Worker:
    """One client working its queues. Use as a context manager for ``run_once`` in tests,
    or call :meth:`run` for the normal loop (``--burst`` with ``config.burst``)."""

    def __init__(
        self, config: WorkerConfig | None = None, engine: BaseEngine | None = None
    ) -> None:
        from django_hopper.engine import get_engine

        self.config = config or WorkerConfig()
        self.engine = engine or get_engine()
        self.client_id: int | None = None
        self.producers = {q: Producer(self, q, c) for q, c in self.config.queues.items() if c > 0}
        self.executions: dict[JobID, Execution] = {}
        self._exec_lock = threading.Lock()
        self.paused_queues: set[str] = set()
        self.limited_queues: set[str] = set()
        #: The lease was refused: claim nothing until registered again.
        self.fenced = False
        #: The lease may have expired (renewals failing): claim nothing meanwhile.
        self.suspended = False
        self.stopping = threading.Event()
        self.stopping_hard = threading.Event()
        self.activity = threading.Event()
        self._signals = 0
        self.completer = Completer(
            self.engine,
            batch_size=int(hopper_settings.COMPLETER_BATCH_SIZE),
            flush_interval=float(hopper_settings.COMPLETER_FLUSH_INTERVAL),
            keep_logs=int(hopper_settings.KEEP_LOGS),
        )
        self.executor = Executor(max(1, self.config.concurrency), self.engine, self._on_done)
        self.heartbeat = Heartbeat(self)
        self.notifier = Notifier(self)
        self.maintainer: Maintainer | None = None
        if self.config.maintenance:
            # Through the direct connection when the alias has one (topology).
            direct = maintenance_alias(self.engine.alias)
            session = self.engine if direct == self.engine.alias else get_engine(direct)
            elector = Elector(session, lambda: self.client_id, float(self.config.leader_ttl or 15))
            self.maintainer = Maintainer(
                session, elector, interval=float(self.config.maintenance_interval or 1)
            )
        self._threads: list[threading.Thread] = []
        self._started = False
        #: Attempts still running when the worker stopped (left to the rescue).
        self.stranded = 0

    # -- lease --------------------------------------------------------------

    def register(self) -> int:
        """Register a client lease and record the queues this worker works.

        Idempotent until the lease is lost, so that a start-up retried after
        a dropped connection does not leave a second lease behind.
        """
        if self.client_id is not None and not self.fenced:
            return self.client_id
        ttl = dt.timedelta(seconds=float(self.config.client_ttl or 30))
        info = {"pid": os.getpid(), "queues": dict(self.config.queues)}
        self.client_id = self.engine.client_register(
            ClientRegisterParams(hostname=socket.gethostname(), ttl=ttl, info=info)
        )
        self.heartbeat.last_renewed = time.monotonic()
        return self.client_id

    def may_claim(self) -> bool:
        """Return whether the worker may claim now (not stopping, fenced or suspended)."""
        return not (self.stopping.is_set() or self.fenced or self.suspended)

    def on_fenced(self) -> None:
        """Stop claiming: the lease expired, so the rescue may own our jobs now.

        Results of the jobs still running are refused by the fence when they
        arrive; once they have all ended, the heartbeat registers a new lease.
        """
        if not self.fenced:
            logger.error(
                "client %s was fenced (its lease expired): claiming stopped; "
                "results of its %d running jobs will be refused",
                self.client_id,
                len(self.executions),
            )
        self.fenced = True
        if self.maintainer is not None:
            self.maintainer.elector.is_leader = False

    # -- control ------------------------------------------------------------

    def apply_control(
        self, cancel_requested: list[JobID], paused: list[str], limited: list[str]
    ) -> None:
        """Apply the control state of a renewal (catches up on missed notifications)."""
        for job_id in cancel_requested:
            self.cancel_job(job_id)
        resumed = self.paused_queues - set(paused)
        self.paused_queues = set(paused)
        self.limited_queues = set(limited)
        for q in resumed:
            if q in self.producers:
                self.producers[q].wake.set()

    def on_control(self, payload: str) -> None:
        """Act on a CHANNEL_CONTROL notification; unknown ones trigger a renewal."""
        msg = ControlMessage.parse(payload)
        if msg is None:
            self.heartbeat.wake.set()
        elif msg.action == ControlAction.CANCEL and msg.job_id is not None:
            self.cancel_job(msg.job_id)
        elif msg.action == ControlAction.PAUSE and msg.queue:
            self.paused_queues.add(msg.queue)
        elif msg.action == ControlAction.RESUME and msg.queue:
            self.paused_queues.discard(msg.queue)
            if msg.queue in self.producers:
                self.producers[msg.queue].wake.set()
        elif msg.action == ControlAction.LIMITS and msg.queue:
            # Switch paths at once: an unlimited claim of a limited queue takes nothing.
            if msg.limited:
                self.limited_queues.add(msg.queue)
            else:
                self.limited_queues.discard(msg.queue)
            if msg.queue in self.producers:
                self.producers[msg.queue].hold_until = 0.0
                self.producers[msg.queue].wake.set()
        else:
            self.heartbeat.wake.set()

    def cancel_job(self, job_id: JobID) -> bool:
        """Cancel a running attempt this worker holds; return False if it holds none."""
        with self._exec_lock:
            ex = self.executions.get(job_id)
        if ex is None or ex.context.cancelled:
            return ex is not None
        ex.log.info("cancellation requested")
        self.executor.cancel(ex)
        return True

    def wake_all(self) -> None:
        """Wake every producer (after missed notifications)."""
        for p in self.producers.values():
            p.wake.set()

    # -- jobs ---------------------------------------------------------------

    def start_job(self, job: JobRow, producer: Producer) -> None:
        """Start a claimed job, or discard it at once if its kind is unknown."""
        from django_hopper.jobs import resolve

        try:
            fn = resolve(job.kind)
        except UnknownJobKind as exc:
            execution.job_logger(job).debug("discarded: %s", exc)
            result = execution.unknown_kind(job, str(exc))
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
        with self._exec_lock:
            self.executions[job.id] = ex
        if _debug():
            ex.log.debug("started")
        self.executor.submit(ex)

    def _on_done(self, ex: Execution, result: JobFinalize | None) -> None:
        """Hand a settled result to the completer (None: decided already) and free the slot."""
        if result is not None:
            self.completer.add(ex.job, result)
        with self._exec_lock:
            self.executions.pop(ex.job.id, None)
        ex.owner.release()

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
                self.completer.add(ex.job, result)

    def running(self) -> int:
        """Return how many attempts are still executing."""
        with self._exec_lock:
            return len(self.executions)

    # -- lifecycle ----------------------------------------------------------

    def setup(self) -> None:
        """Import job modules, register the lease, start the completer and the executor."""
        if self._started:
            return
        import_job_modules()
        from django_hopper.streams import sync_declared

        sync_declared(self.engine)  # the subscriptions and consumers the modules declare
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
        self.stopping.set()
        self.activity.set()
        for p in self.producers.values():
            p.wake.set()

    def _maintain(self) -> None:
        if self.maintainer is not None:
            self.maintainer.run(self.stopping)

    def run(self, install_signals: bool = True) -> int:
        """Work until stopped (or, in burst mode, until nothing is left); return an exit code."""
        if install_signals:
            self.install_signals()
        if not self._setup_until_reachable():
            return 0
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
                    if self.completer.flushes == flushes and not self.fenced:
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
        self.stopping_hard.set()
        self.heartbeat.wake.set()
        if self.maintainer is not None:
            self.maintainer.wake.set()
        for t in self._threads:
            t.join(timeout=5)
        try:
            if self.maintainer is not None and self.client_id is not None:
                self.maintainer.elector.resign(self.client_id)
            if self.client_id is not None:
                self.engine.client_delete(self.client_id)
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
