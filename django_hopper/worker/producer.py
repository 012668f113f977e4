"""The producer: claims one queue's jobs, up to its free slots (and, while its jobs
are short, a buffer's worth ahead of them), when woken or polled."""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_hopper import registry
from django_hopper.conf import hopper_settings
from django_hopper.engine.params import (
    JobClaimParams,
    JobPassTakeoverParams,
    JobReturnManyParams,
)
from django_hopper.topology import prepares
from django_hopper.worker.db import (
    Backoff,
    ConnectionWatch,
    close_thread_connections,
    reset_connection,
)

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JobID, JobRow
    from django_hopper.worker.control import ControlState

logger = logging.getLogger("django_hopper.worker")

#: After a claim that filled every free slot and the buffer (more work is likely
#: waiting), claim again once this fraction of what a full claim takes is free
#: (slots and buffer room), so that each claim carries many jobs instead of one
#: per finished job, and, with a buffer, is sent while half of it still feeds
#: the slots: the claim's round trip overlaps running jobs instead of idling them...
REFILL = 0.5
#: ...but never leave a freed slot idle longer than this many seconds.
REFILL_WAIT = 0.002
#: Claim ahead of the free slots only while the queue's jobs run shorter than
#: this on average (seconds): a claim's round trip is then a large part of a
#: slot's cycle, and a buffered job waits about one run. For longer jobs it buys
#: nothing and would hold jobs a later, higher-priority one could pass.
AHEAD_MAX_RUN = 0.01
#: A buffered job waiting longer than this (seconds; its jobs turned slow) is
#: given back, with the rest of the buffer, so another worker can run them.
AHEAD_MAX_WAIT = 0.2
#: After a claim that did not fill its room (the queue idle or draining), the
#: next claim takes at most this many jobs per slot ahead: the claim a wake-up
#: sends for one new job then runs with the smaller limit, which measured 0.3 ms
#: sooner from commit to start than a full claim's, and a busy queue's claims
#: are full again from the second one.
IDLE_AHEAD_PER_SLOT = 4
#: The weight of the latest run time in the running mean the decision reads.
RUN_MEAN_WEIGHT = 0.1
#: The buffer holds at most what the slots run in this many seconds at the
#: queue's mean run time, so that a buffered job (and a higher-priority job
#: enqueued behind the buffer) waits about this long at most, well inside
#: AHEAD_MAX_WAIT, whatever ``ahead`` allows.
AHEAD_FILL = 0.05
#: Runs of each claim statement :meth:`Producer.warm_up` makes at start: PostgreSQL
#: plans a prepared statement's first five runs for their values, then reuses its
#: generic plan.
WARM_CLAIM_RUNS = 5
#: The client of a warm-up claim: none (client IDs start at 1), so the claim's
#: gate is closed and it reads no job, locks nothing and claims nothing.
NO_CLIENT = 0


class Producer:
    """Claims jobs of one queue, up to its free slots, when woken or when the poll fires.

    It starts each claimed job through ``start_job`` (the worker's, which hands
    it to the executor) and gets the slot back through :meth:`release`.

    While the queue's jobs are short and it has no limits, a claim also takes
    up to ``ahead`` jobs beyond the free slots, which the claim statement marks
    as claimed ahead; they wait in :attr:`buffer`, in claim order, and the next
    one starts the moment a slot frees, with no round trip, so the next claim
    overlaps running jobs instead of holding a freed slot idle. A buffered job
    never started, so one given back (on stop, once fenced, or after waiting
    :data:`AHEAD_MAX_WAIT`) costs neither an attempt nor an admission miss
    (``job_return_many``); a worker that dies holding some has each counted
    as an admission miss by the rescue, since nothing tells whether it started.
    """

    def __init__(
        self,
        queue: str,
        concurrency: int,
        *,
        engine: BaseEngine,
        control: ControlState,
        start_job: Callable[[JobRow, Producer], None],
        poll_interval: float,
        claim_debounce: float,
        ahead: int = 0,
        unstarted: Callable[[JobRow], None] | None = None,
    ) -> None:
        self.queue = queue
        self.concurrency = concurrency
        #: Jobs claimed ahead of the free slots at most (0: never).
        self.ahead = max(0, ahead)
        #: Ends a buffered job the return left running (its cancel was requested).
        self.unstarted = unstarted
        #: Jobs claimed ahead, with the monotonic time of their claim, in claim order.
        self.buffer: deque[tuple[JobRow, float]] = deque()
        #: Jobs whose return failed: it may have committed (its answer lost), so
        #: they are never started, only given back again.
        self.unreturned: list[JobRow] = []
        #: The running mean of the queue's run times (seconds). It starts at the
        #: bound, so claims go ahead only once the queue's jobs proved short.
        self.mean_run = AHEAD_MAX_RUN
        #: Buffered jobs given back unstarted, in all (kept for inspection and tests).
        self.returned = 0
        self.engine = engine
        self.control = control
        self.start_job = start_job
        self.poll_interval = poll_interval
        self.claim_debounce = claim_debounce
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self.running = 0
        #: The last claim filled every free slot: there may be more work.
        self.full = False
        #: Monotonic time before which the rate limit allows nothing.
        self.hold_until = 0.0
        #: Monotonic time the latest claim started (for the debounce).
        self.last_claim = 0.0
        self.claims = 0
        #: Jobs claimed in all, and by the latest claim (read by the metrics).
        self.claimed = 0
        self.last_batch = 0
        #: Monotonic time before which no takeover of expired pass leases is tried.
        self.next_takeover = 0.0
        self.thread: threading.Thread | None = None

    def free(self) -> int:
        """Return how many more jobs a claim of this queue may take now: its free
        slots plus the room left in its buffer."""
        with self._lock:
            return self._room()

    def _room(self) -> int:
        """Return the free slots plus the buffer's room (hold the lock)."""
        slots = max(0, self.concurrency - self.running)
        return slots + max(0, self._ahead_cap() - len(self.buffer) - len(self.unreturned))

    def _ahead_cap(self) -> int:
        """Return how many jobs may wait in the buffer now: while the queue's jobs
        are short, ``ahead`` or what the slots run in AHEAD_FILL, the fewer; else none."""
        mean = self.mean_run
        if mean >= AHEAD_MAX_RUN:
            return 0
        if mean <= 0:
            return self.ahead
        return min(self.ahead, int(self.concurrency * AHEAD_FILL / mean))

    def _refill_at(self) -> int:
        """Return the room (free slots plus buffer room) after which a full claim is
        followed by the next one: REFILL of a full claim (hold the lock)."""
        return max(1, int((self.concurrency + self._ahead_cap()) * REFILL))

    def _refill_due(self) -> bool:
        """Return whether the next claim is due after a full one: enough room is
        free, or a slot idles (hold the lock). While buffered jobs feed every
        slot and little room is free, a claim would carry few jobs for its cost."""
        return self._room() >= self._refill_at() or self.running < self.concurrency

    def wait_refill(self) -> None:
        """After a full claim, give more room up to REFILL_WAIT to free before claiming.

        A claim has a fixed cost, so it should carry many jobs rather than the
        one slot that just freed; :meth:`release` ends the wait as soon as
        :meth:`_refill_at` is free. Call right before a claim.
        """
        if self.full and self.free() < self._refill_at():
            self.wake.clear()
            if self.free() < self._refill_at():
                self.wake.wait(REFILL_WAIT)
            self.wake.clear()  # the claim that follows covers whatever woke us

    def release(self, ran: float | None = None) -> None:
        """Free a slot (``ran``: the seconds its job ran), or start the next
        buffered job in it; wake the producer if the queue may hold more work."""
        control = self.control
        nxt: JobRow | None = None
        with self._lock:
            if ran is not None:
                self.mean_run += RUN_MEAN_WEIGHT * (ran - self.mean_run)
            if self.buffer and not self._buffer_held():
                nxt = self.buffer.popleft()[0]  # the slot passes to it
            else:
                self.running -= 1
            free = self._room()
            # The first slot left idle starts the refill wait; enough room ends it.
            refill = free >= self._refill_at() or (
                nxt is None and self.running == self.concurrency - 1
            )
        if nxt is not None:
            # In an empty context: the finishing attempt's context (its trace
            # span, asgiref's sync-thread marker when it ended through
            # sync_to_async) must not become the next attempt's.
            contextvars.Context().run(self.start_job, nxt, self)
        # An event already set is left alone (setting it again takes its
        # condition and notifies nobody): whoever clears one reads the slots
        # after the clear, so this release is seen either way.
        if self.full and refill:
            if not self.wake.is_set():
                self.wake.set()
            if not control.activity.is_set():
                control.activity.set()
        elif free >= self.concurrency and not control.activity.is_set():
            control.activity.set()  # idle now: burst mode and wait_idle look again

    def _buffer_held(self) -> bool:
        """Return whether buffered jobs must not start: the worker stops or was
        fenced, or the queue was paused or given limits since they were claimed.

        A paused queue starts nothing new, and a limited one counts running jobs
        (buffered ones among them) that its limits were not applied to; either
        way the buffer goes back (:meth:`return_stale`).
        """
        control = self.control
        return control.stopping.is_set() or control.fenced or self._queue_held()

    def _queue_held(self) -> bool:
        """Return whether the queue is paused or has limits: nothing is claimed
        ahead for it, and what was goes back."""
        control = self.control
        return self.queue in control.paused_queues or self.queue in control.limited_queues

    def claim_once(self, *, takeover_after: bool = False) -> int:
        """Claim up to the free slots (and the buffer's room) in one call, start the
        jobs the slots take and buffer the rest; return how many were claimed.

        The queue's expired pass leases are taken over (:meth:`take_over`, at
        most once per poll interval) right before the claim, or, with
        ``takeover_after`` (the producer's own loop), right after it: the claim
        a wake-up sends for a new job then never waits for the takeover's round
        trips, and a takeover that ended some leases wakes the producer, so
        their runs are claimed by the claim that follows at once.
        """
        control = self.control
        if not control.may_claim_from(self.queue):
            return 0
        if time.monotonic() < self.hold_until:
            return 0
        limited = self.queue in control.limited_queues
        with self._lock:
            if self.full and not self._refill_due():
                return 0  # release() wakes the producer once it is
            free = max(0, self.concurrency - self.running)
            held = len(self.buffer) + len(self.unreturned)
            cap = self._ahead_cap()
            if not self.full:
                cap = min(cap, IDLE_AHEAD_PER_SLOT * self.concurrency)
            room = 0 if limited else max(0, cap - held)
        client_id = control.client_id
        if free + room <= 0 or client_id is None:
            return 0
        self.last_claim = time.monotonic()
        if not takeover_after:
            self._take_over_or_warn(self.last_claim)
        claimed = self._claim(client_id, free, room, limited)
        if takeover_after and self._take_over_or_warn(self.last_claim):
            self.wake.set()  # the runs taken over are claimable now
        return claimed

    def _take_over_or_warn(self, now: float) -> int:
        """Run :meth:`take_over`; log a failure and go on claiming (return 0)."""
        try:
            return self.take_over(now)
        except Exception:
            # The claim goes on: a takeover that fails (one bad row, a lock) must
            # not stop the queue; it is tried again after the poll interval.
            reset_connection(self.engine.alias)
            logger.warning(
                "taking over the expired pass leases of queue %s failed; claiming anyway",
                self.queue,
                exc_info=True,
            )
            return 0

    def _claim(self, client_id: int, free: int, room: int, limited: bool) -> int:
        """Send the claim of ``free`` slots and ``room`` ahead; start and buffer its jobs."""
        result = self.engine.job_claim(
            JobClaimParams(
                queue=self.queue, client_id=client_id, limit=free, ahead=room, limited=limited
            )
        )
        jobs = result.jobs
        self.claims += 1
        self.claimed += len(jobs)
        self.last_batch = len(jobs)
        if result.wait > dt.timedelta(0):
            self.hold_until = time.monotonic() + result.wait.total_seconds()
        self.full = len(jobs) >= free + room
        if not jobs:
            return 0
        ahead = result.ahead
        start: list[JobRow]
        later: list[JobRow]
        if ahead:
            start, later = [], []
            for j in jobs:  # one membership test per job (a UUID hashes in Python)
                (later if j.id in ahead else start).append(j)
        else:
            start, later = jobs, []
        with self._lock:
            # Slots freed during the claim take claimed-ahead jobs at once.
            if later and not self._buffer_held():
                spare = max(0, self.concurrency - self.running - len(start))
                start += later[:spare]
                later = later[spare:]
            self.running += len(start)
            if later:
                now = time.monotonic()
                self.buffer.extend((job, now) for job in later)
        for job in start:
            self.start_job(job, self)
        return len(jobs)

    def take_buffered(self, job_id: JobID) -> JobRow | None:
        """Remove a buffered job (its cancel was requested) and return it, or None."""
        with self._lock:
            for i, (job, _at) in enumerate(self.buffer):
                if job.id == job_id:
                    del self.buffer[i]
                    return job
        return None

    def buffer_wait(self) -> float | None:
        """Return the seconds until the oldest buffered job waits too long (None: empty;
        0 while a failed return waits to be tried again)."""
        with self._lock:
            if self.unreturned:
                return 0.0
            if not self.buffer:
                return None
            return self.buffer[0][1] + AHEAD_MAX_WAIT - time.monotonic()

    def return_stale(self) -> int:
        """Give the buffer back if its oldest job waited longer than AHEAD_MAX_WAIT,
        the worker was fenced, or the queue was paused or given limits since the
        claim; return how many jobs went back.

        A job held that long means the running jobs turned slow: the mean run
        time is raised to the wait, so that claims stop going ahead until short
        runs bring it down again. A pause or new limits say nothing of the run
        times: the mean is kept.
        """
        wait = self.buffer_wait()
        if wait is None:
            return 0
        if self._queue_held():
            return self.return_buffer()
        if wait > 0 and not self.control.fenced:
            return 0
        with self._lock:
            self.mean_run = max(self.mean_run, AHEAD_MAX_RUN, AHEAD_MAX_WAIT)
        return self.return_buffer()

    def return_buffer(self, *, final: bool = False) -> int:
        """Give every buffered job back in one fenced statement; return how many went back.

        A job the statement leaves running has a cancel requested (it is ended
        as canceled through ``unstarted``, once a read confirms the request) or
        is no longer this claim's (the rescue took it: left alone). If the
        statement fails, it may still have committed (its answer lost), so the
        jobs are never started: they wait in :attr:`unreturned` to be given back
        again (a return is fenced, so a second one of a job finds nothing), or,
        when ``final``, are left to the rescue, which counts each as an
        admission miss once this worker's lease is gone.
        """
        with self._lock:
            jobs = [*self.unreturned, *(job for job, _at in self.buffer)]
            self.unreturned.clear()
            self.buffer.clear()
        if not jobs:
            return 0
        # Fenced to the claims that took them: a worker registered again since
        # (after being fenced) holds them under its former client ID.
        claims: dict[int, list[tuple[JobID, int]]] = {}
        for j in jobs:
            if j.attempted_by is not None:
                claims.setdefault(j.attempted_by, []).append((j.id, j.fence))
        returned: set[JobID] = set()
        try:
            for client_id, pairs in claims.items():
                returned.update(
                    self.engine.job_return_many(
                        JobReturnManyParams(client_id=client_id, jobs=pairs)
                    )
                )
        except Exception:
            if final:
                logger.warning(
                    "giving back %d jobs of queue %s claimed ahead failed: left to the rescue",
                    len(jobs),
                    self.queue,
                    exc_info=True,
                )
                return 0
            with self._lock:
                self.unreturned.extend(job for job in jobs if job.id not in returned)
            raise
        self.returned += len(returned)
        for job in jobs:
            if job.id not in returned and self.unstarted is not None and self._cancel_held(job):
                self.unstarted(job)
        if returned:
            logger.debug(
                "gave back %d jobs of queue %s claimed ahead, unstarted", len(returned), self.queue
            )
        return len(returned)

    def _cancel_held(self, job: JobRow) -> bool:
        """Return whether a job the return left running is still this claim's, with a
        cancel requested, so the worker ends it as canceled.

        The return also leaves out a job the rescue took (its worker was fenced):
        that job runs elsewhere, and must not be reported canceled here. If the
        read fails, the job is left to the rescue, which cancels a job whose
        cancel was requested.
        """
        try:
            row = self.engine.job_get(job.id)
        except Exception:
            logger.warning("reading job %s claimed ahead failed", job.id, exc_info=True)
            return False
        return (
            row is not None
            and row.state == "running"
            and row.attempted_by == job.attempted_by
            and row.fence == job.fence
            and row.cancel_requested_at is not None
        )

    def take_over(self, now: float, *, db_now: dt.datetime | None = None) -> int:
        """End the queue's expired pass leases, so that a claim can take their runs over.

        A resumable pass that hung or whose process died stops renewing its
        lease; once it expires the next claim of its queue takes the run over
        (a pass that had begun is charged an attempt, a claim that never began
        is an admission miss), without waiting for the leader's sweep. Tried
        at most once per poll interval: one probe of the few leased jobs
        (index ``hopper_job_lease``), whatever the claim rate.
        """
        if now < self.next_takeover:
            return 0
        self.next_takeover = now + self.poll_interval
        kinds = registry.resumable()
        taken = self.engine.job_pass_takeover_many(
            JobPassTakeoverParams(
                kinds=kinds,
                limit=100,
                max_misses=int(hopper_settings.ADMISSION_MISS_MAX),
                queue=self.queue,
                now=db_now,
            )
        )
        for t in taken:
            logger.warning(
                "took over run %s of queue %s: its pass lease expired (%s)",
                t.id,
                self.queue,
                "the pass had begun: one attempt charged"
                if t.began
                else f"the claim never began: admission miss {t.misses}",
            )
        return len(taken)

    def warm_up(self) -> int:
        """Run this queue's first claim statements with no client, before any job
        waits for them; return how many ran.

        Where the engine plans prepared claims (``plans_prepared_claims``) and
        this alias prepares statements (:func:`~django_hopper.topology.prepares`),
        the claim of the free slots and the claim an idle queue sends (the free
        slots and up to IDLE_AHEAD_PER_SLOT a slot ahead) each run
        WARM_CLAIM_RUNS times on the producer's connection: they are prepared,
        planned and settle on the generic plan, and the connection loads its
        catalog caches, instead of the first jobs a new worker picks up paying
        for it. With no client the claim's gate is closed: no job is read,
        locked or claimed. A queue with limits claims by another statement and
        is left as it is. A failure is logged; the producer claims as usual.
        """
        if not self.engine.features.plans_prepared_claims or not prepares(self.engine.alias):
            return 0
        if self.queue in self.control.limited_queues:
            return 0
        idle_room = min(self.ahead, IDLE_AHEAD_PER_SLOT * self.concurrency)
        sizes = [(self.concurrency, 0)] + ([(self.concurrency, idle_room)] if idle_room else [])
        runs = 0
        try:
            for limit, ahead in sizes:
                for _ in range(WARM_CLAIM_RUNS):
                    self.engine.job_claim(
                        JobClaimParams(
                            queue=self.queue, client_id=NO_CLIENT, limit=limit, ahead=ahead
                        )
                    )
                    runs += 1
        except Exception:
            reset_connection(self.engine.alias)
            logger.warning("warming the claim of queue %s failed", self.queue, exc_info=True)
        return runs

    def debounce(self) -> None:
        """Hold a wake-up that follows the previous claim closely; call before a claim.

        Leading edge: a wake-up long after the last claim (an idle queue's
        first insert) claims at once, so pickup latency is not taxed. One
        within ``claim_debounce`` of it (a burst of inserts, each notifying)
        waits for the rest of the interval, and every wake-up that arrives
        meanwhile is covered by the one claim that follows. After a full
        claim the refill wait governs instead: work is known to be waiting.
        """
        window = self.claim_debounce
        if window <= 0 or self.full:
            return
        rest = self.last_claim + window - time.monotonic()
        if rest > 0:
            self.control.stopping.wait(rest)
            self.wake.clear()  # the claim that follows covers them

    def run(self) -> None:
        """Claim when woken (notification, freed slot) or when the poll interval passes."""
        stopping = self.control.stopping
        poll = self.poll_interval
        delay = Backoff(0.1, 5.0)
        watch = ConnectionWatch(f"claiming from queue {self.queue}")
        self.wake.set()  # claim at start
        try:
            self.warm_up()
            while not stopping.is_set():
                wait = self.buffer_wait()
                woken = self.wake.wait(poll if wait is None else max(0.0, min(wait, poll)))
                if stopping.is_set():
                    break
                self.wake.clear()
                if woken:
                    self.debounce()
                    self.wait_refill()
                hold = self.hold_until - time.monotonic()
                if hold > 0:
                    stopping.wait(min(hold, poll))
                try:
                    self.return_stale()
                    self.claim_once(takeover_after=True)
                    delay.reset()
                    watch.ok()
                except Exception as exc:
                    reset_connection(self.engine.alias)
                    watch.failed(exc)
                    stopping.wait(delay.next())
                    self.wake.set()
        finally:
            close_thread_connections()
