"""Leader election through a lease, and the loop that runs the leader's services."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from django_hopper.engine.params import LeaderParams
from django_hopper.maintenance.base import Service
from django_hopper.maintenance.periodic import PeriodicEnqueuer
from django_hopper.maintenance.services import StreamPumper, default_services
from django_hopper.worker import wakeups
from django_hopper.worker.db import Backoff, close_thread_connections, reset_connection

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine

logger = logging.getLogger("django_hopper.maintenance")


class Elector:
    """Take or renew the leader lease for a client.

    ``client_id`` is a callable because a worker that was fenced registers
    again under a new ID.
    """

    def __init__(self, engine: BaseEngine, client_id: Callable[[], int | None], ttl: float) -> None:
        self.engine = engine
        self.client_id = client_id
        self.ttl = float(ttl)
        self.is_leader = False

    def run_once(self) -> bool:
        """Attempt the lease; return whether this client leads afterwards."""
        cid = self.client_id()
        if cid is None:
            self._set(False, None)
            return False
        leads = self.engine.leader_attempt(
            LeaderParams(client_id=cid, ttl=dt.timedelta(seconds=self.ttl))
        )
        self._set(leads, cid)
        return leads

    def _set(self, leads: bool, cid: int | None) -> None:
        if leads != self.is_leader:
            logger.info("client %s %s leadership", cid, "gained" if leads else "lost")
        self.is_leader = leads

    def resign(self, client_id: int | None = None) -> None:
        """Give up the lease so that another client is elected at once."""
        cid = client_id if client_id is not None else self.client_id()
        if cid is not None:
            self.engine.leader_resign(cid)
        self.is_leader = False


class _Wake(threading.Event):
    """An event that also rings a bell, so that one wait serves every wake-up."""

    def __init__(self, bell: threading.Event) -> None:
        super().__init__()
        self._bell = bell

    def set(self) -> None:
        super().set()
        self._bell.set()


class Maintainer:
    """Elect, and while leading, run each service when its interval has passed.

    Between rounds, stream appends (:meth:`wake_streams`, from the notifier)
    make the leader pump the consumers of the appended topics at once, so a
    delivery does not wait for the next round.
    """

    #: Seconds a woken pump waits after the previous one, so that the appends of
    #: a burst share a pump instead of each paying for one.
    pump_debounce = 0.02

    def __init__(
        self,
        engine: BaseEngine,
        elector: Elector,
        *,
        interval: float,
        services: Sequence[Service] | None = None,
    ) -> None:
        self.engine = engine
        self.elector = elector
        self.interval = float(interval)
        self.services = (
            list(services) if services is not None else default_services(engine, elector.client_id)
        )
        self._last: dict[str, float] = {}
        self._bell = threading.Event()
        #: Set to hold the election now (CHANNEL_LEADER, a resign, a stop).
        self.wake: threading.Event = _Wake(self._bell)
        self._topics: set[str] = set()
        self._topics_lock = threading.Lock()
        self._pumped_at = float("-inf")

    def run_services(self, force: bool = False, at: float | None = None) -> dict[str, int]:
        """Run the services that are due (all with ``force``); return rows changed per service.

        ``at`` is the loop's scheduled tick (monotonic seconds; default now).
        A service is due when its interval has passed since the tick it last
        ran at (one that never ran: its ``first_delay`` after the first round
        this maintainer leads), measured between ticks rather than between the moments the
        services happened to start: the election before them takes a variable
        time, and a tick measured as 0.999 s after the last one would skip a
        1-second service for a whole round.
        """
        out: dict[str, int] = {}
        now = time.monotonic() if at is None else at
        for service in self.services:
            last = self._last.get(service.name)
            if last is None and not force and service.first_delay > 0:
                # The first round this maintainer leads: the service is first due
                # ``first_delay`` from now, then every ``interval``.
                last = self._last[service.name] = now + service.first_delay - service.interval
            if not force and last is not None and now - last < service.interval - TICK_SLACK:
                continue
            self._last[service.name] = now
            try:
                out[service.name] = service.run_once()
            except Exception:
                reset_connection(self.engine.alias)
                logger.exception("maintenance service %s failed", service.name)
        return out

    def register(self) -> None:
        """Record what every client declares, leader or not (periodic definitions)."""
        for service in self.services:
            if isinstance(service, PeriodicEnqueuer):
                try:
                    service.register()
                except Exception:
                    reset_connection(self.engine.alias)
                    logger.exception("registering periodic jobs failed")

    def wake_streams(self, topic: str) -> None:
        """Have the consumers of ``topic`` pumped soon (an append committed), if leading."""
        with self._topics_lock:
            self._topics.add(topic)
        self._bell.set()

    def pump_woken(self) -> int | None:
        """Pump the consumers matching the topics woken since the last call.

        Returns the deliveries inserted, or None when no topic was woken or
        this client does not lead (the leader alone pumps; others drop the
        topics, which the leader heard too).
        """
        with self._topics_lock:
            topics, self._topics = self._topics, set()
        if not topics or not self.elector.is_leader:
            return None
        self._pumped_at = time.monotonic()
        for service in self.services:
            if isinstance(service, StreamPumper):
                try:
                    return service.run_once(topics=topics)
                except Exception:
                    reset_connection(self.engine.alias)
                    logger.exception("pumping woken stream consumers failed")
        return 0

    def _wait(self, tick: float, stop: threading.Event) -> float:
        """Wait for the next tick, pumping woken streams meanwhile; return the next tick.

        An election request (``wake``) ends the wait at once and starts the
        schedule again from now.
        """
        while not stop.is_set():
            remaining = tick - time.monotonic()
            rang = self._bell.wait(max(remaining, 0.0))
            self._bell.clear()
            if self.wake.is_set():
                self.wake.clear()
                return time.monotonic()
            if not rang:
                return tick
            hold = self._pumped_at + self.pump_debounce - time.monotonic()
            if hold > 0 and self.wake.wait(min(hold, max(tick - time.monotonic(), 0.0))):
                continue
            if time.monotonic() >= tick:
                return tick  # the round pumps every consumer
            self.pump_woken()
        return tick

    def run_once(self, at: float | None = None) -> dict[str, int] | None:
        """Elect, then run due services if leading; None when not the leader.

        A term that ends forgets when its services ran: another leader kept
        the schedule meanwhile, so a maintainer elected again starts as a new
        leader does (upkeep held back by its ``first_delay``).
        """
        if not self.elector.run_once():
            self._last.clear()
            return None
        return self.run_services(at=at)

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop``: renew the lease often enough, run services while leading.

        The lease is renewed at least three times per TTL; a CHANNEL_LEADER
        notification (``wake``) makes the next election happen at once, and
        a stream append (:meth:`wake_streams`) a pump of its consumers.
        Rounds keep to a schedule (each tick one period after the previous
        *tick*, not after the previous round ended), so the time the services
        take does not stretch the period: a 1-second periodic job gets a
        round in every second and no slot is skipped. A round that overran
        whole periods skips the ticks it missed instead of running them in a
        burst.
        """
        period = min(self.interval, self.elector.ttl / 3)
        delay = Backoff(0.1, max(period, 1.0))
        tick = time.monotonic()
        wakeups.listen(self.wake_streams)  # appends committed in this process (SQLite)
        try:
            while not stop.is_set():
                try:
                    self.run_once(at=tick)
                    delay.reset()
                    tick = next_tick(tick, period, time.monotonic())
                except Exception:
                    reset_connection(self.engine.alias)
                    wait = delay.next()
                    logger.warning("leader election failed; retrying in %.2fs", wait, exc_info=True)
                    tick = time.monotonic() + wait
                tick = self._wait(tick, stop)
        finally:
            wakeups.unlisten(self.wake_streams)
            for service in self.services:
                service.close()
            close_thread_connections()


#: Seconds of timer jitter tolerated when deciding whether a service is due.
TICK_SLACK = 0.001


def next_tick(previous: float, period: float, now: float) -> float:
    """Return the first tick after ``now`` on the schedule ``previous + k * period``.

    Normally ``previous + period``; after a round that overran, the next tick
    still on the schedule, so missed ticks are skipped, not run back to back.
    """
    tick = previous + period
    if tick <= now and period > 0:
        tick += ((now - tick) // period + 1) * period
    return tick
