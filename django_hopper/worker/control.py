"""The control state a worker's threads share, and the control messages that change it.

The producers read it before each claim (may this worker claim, is this queue
paused or rate limited); the heartbeat writes it from each renewal (the lease,
the paused and limited queues, cancel requests); the notifier writes it from
``CHANNEL_CONTROL`` notifications between renewals. Keeping it in one object,
rather than as attributes of the worker that each thread reaches into, makes
each role readable on its own: a role only touches this state and its own.

Plain attributes, no lock: each is replaced whole (a set is swapped, never
mutated by the heartbeat) or is a flag a later read may see a moment late, and
every decision taken on a stale value is safe (one claim more or less; the
fence refuses a claim of a client that lost its lease).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_hopper.types import ControlAction, ControlMessage

if TYPE_CHECKING:
    from django_hopper.types import JobID
    from django_hopper.worker.producer import Producer

logger = logging.getLogger("django_hopper.worker")


def _no_cancel(job_id: JobID) -> bool:
    return False


def log_control_changes(
    paused_before: set[str],
    paused: set[str],
    limited_before: set[str] | None = None,
    limited: set[str] | None = None,
) -> None:
    """Log each queue an operator paused, resumed, limited or unlimited (console lines).

    Only changes are said: a renewal that repeats the state already known
    prints nothing, so each operator action is one line per worker.
    """
    for q in sorted(paused - paused_before):
        logger.info("queue %s paused: nothing more is claimed from it", q)
    for q in sorted(paused_before - paused):
        logger.info("queue %s resumed", q)
    if limited_before is None or limited is None:
        return
    for q in sorted(limited - limited_before):
        logger.info("queue %s limits set: claims follow its concurrency and rate limits", q)
    for q in sorted(limited_before - limited):
        logger.info("queue %s limits removed", q)


class ControlState:
    """What may be claimed now, and the wake-ups that act on a change at once."""

    def __init__(self) -> None:
        #: The client lease this worker holds (None before registering).
        self.client_id: int | None = None
        #: Queues paused by an operator: their producers claim nothing.
        self.paused_queues: set[str] = set()
        #: Queues with a concurrency or rate limit: their producers use the limited claim.
        self.limited_queues: set[str] = set()
        #: The lease was refused: claim nothing until registered again.
        self.fenced = False
        #: The lease may have expired (renewals failing): claim nothing meanwhile.
        self.suspended = False
        #: Set to stop claiming (a graceful stop has begun).
        self.stopping = threading.Event()
        #: Set once running jobs are done with: the heartbeat and notifier end.
        self.stopping_hard = threading.Event()
        #: Set when something the main thread waits on changed (a slot freed, a stop).
        self.activity = threading.Event()
        #: Set to renew the lease now rather than at the next interval.
        self.renew = threading.Event()
        #: Set to hold the next leader election now (None: this worker does not elect).
        self.elect: threading.Event | None = None
        #: Called with an appended topic, to pump its consumers now if this worker
        #: leads (None: this worker runs no maintenance).
        self.streams: Callable[[str], None] | None = None
        #: The producers by queue, woken when their queue may have work.
        self.producers: dict[str, Producer] = {}
        #: Cancels a running attempt this worker holds; False when it holds none.
        self.cancel: Callable[[JobID], bool] = _no_cancel

    def may_claim(self) -> bool:
        """Return whether the worker may claim now (not stopping, fenced or suspended)."""
        return not (self.stopping.is_set() or self.fenced or self.suspended)

    def may_claim_from(self, queue: str) -> bool:
        """Return whether the worker may claim from ``queue`` now."""
        return self.may_claim() and queue not in self.paused_queues

    def wake(self, queue: str) -> None:
        """Wake the producer of ``queue`` (if this worker works it)."""
        producer = self.producers.get(queue)
        if producer is not None:
            producer.wake.set()

    def wake_all(self) -> None:
        """Wake every producer (after missed notifications)."""
        for producer in self.producers.values():
            producer.wake.set()

    def apply(self, cancel_requested: list[JobID], paused: list[str], limited: list[str]) -> None:
        """Apply the control state of a renewal (catches up on missed notifications)."""
        for job_id in cancel_requested:
            self.cancel(job_id)
        resumed = self.paused_queues - set(paused)
        # Newly paused or limited: its producer gives back what it claimed ahead.
        held = (set(paused) - self.paused_queues) | (set(limited) - self.limited_queues)
        log_control_changes(self.paused_queues, set(paused), self.limited_queues, set(limited))
        self.paused_queues = set(paused)
        self.limited_queues = set(limited)
        for queue in resumed | held:
            self.wake(queue)

    def on_message(self, payload: str) -> None:
        """Act on a ``CHANNEL_CONTROL`` notification; unknown ones trigger a renewal."""
        msg = ControlMessage.parse(payload)
        if msg is None:
            self.renew.set()
        elif msg.action == ControlAction.CANCEL and msg.job_id is not None:
            self.cancel(msg.job_id)
        elif msg.action == ControlAction.PAUSE and msg.queue:
            paused = self.paused_queues | {msg.queue}
            log_control_changes(self.paused_queues, paused)
            self.paused_queues = paused
            self.wake(msg.queue)  # its producer gives back what it claimed ahead
        elif msg.action == ControlAction.RESUME and msg.queue:
            paused = self.paused_queues - {msg.queue}
            log_control_changes(self.paused_queues, paused)
            self.paused_queues = paused
            self.wake(msg.queue)
        elif msg.action == ControlAction.LIMITS and msg.queue:
            # Switch paths at once: an unlimited claim of a limited queue takes nothing.
            if msg.limited:
                limited = self.limited_queues | {msg.queue}
            else:
                limited = self.limited_queues - {msg.queue}
            log_control_changes(set(), set(), self.limited_queues, limited)
            self.limited_queues = limited
            producer = self.producers.get(msg.queue)
            if producer is not None:
                producer.hold_until = 0.0
                producer.wake.set()
        else:
            self.renew.set()
