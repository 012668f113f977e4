"""The producer: claims one queue's jobs, up to its free slots, when woken or polled."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_hopper import registry
from django_hopper.conf import hopper_settings
from django_hopper.engine.params import JobClaimParams, JobPassTakeoverParams
from django_hopper.worker.db import (
    Backoff,
    ConnectionWatch,
    close_thread_connections,
    reset_connection,
)

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JobRow
    from django_hopper.worker.control import ControlState

logger = logging.getLogger("django_hopper.worker")

#: After a claim that filled every free slot (more work is likely waiting),
#: claim again once this fraction of the queue's concurrency is free, so that
#: each claim carries several jobs instead of one per finished job...
REFILL = 0.5
#: ...but never leave a freed slot idle longer than this many seconds.
REFILL_WAIT = 0.002


class Producer:
    """Claims jobs of one queue, up to its free slots, when woken or when the poll fires.

    It starts each claimed job through ``start_job`` (the worker's, which hands
    it to the executor) and gets the slot back through :meth:`release`.
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
    ) -> None:
        self.queue = queue
        self.concurrency = concurrency
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
        #: Monotonic time before which no takeover of expired pass leases is tried.
        self.next_takeover = 0.0
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
            self.control.activity.set()
        elif free >= self.concurrency:
            self.control.activity.set()  # idle now: burst mode and wait_idle look again

    def claim_once(self) -> int:
        """Claim up to the free slots in one call and start the jobs; return how many."""
        control = self.control
        if not control.may_claim_from(self.queue):
            return 0
        if time.monotonic() < self.hold_until:
            return 0
        free = self.free()
        client_id = control.client_id
        if free <= 0 or client_id is None:
            return 0
        self.last_claim = time.monotonic()
        try:
            self.take_over(self.last_claim)
        except Exception:
            # The claim goes on: a takeover that fails (one bad row, a lock) must
            # not stop the queue; it is tried again after the poll interval.
            reset_connection(self.engine.alias)
            logger.warning(
                "taking over the expired pass leases of queue %s failed; claiming anyway",
                self.queue,
                exc_info=True,
            )
        result = self.engine.job_claim(
            JobClaimParams(
                queue=self.queue,
                client_id=client_id,
                limit=free,
                limited=self.queue in control.limited_queues,
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
                self.start_job(job, self)
        return len(result.jobs)

    def take_over(self, now: float, *, db_now: dt.datetime | None = None) -> int:
        """End the queue's expired pass leases, so this claim can take their runs over.

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
            while not stopping.is_set():
                woken = self.wake.wait(poll)
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
                    self.claim_once()
                    delay.reset()
                    watch.ok()
                except Exception as exc:
                    reset_connection(self.engine.alias)
                    watch.failed(exc)
                    stopping.wait(delay.next())
                    self.wake.set()
        finally:
            close_thread_connections()
