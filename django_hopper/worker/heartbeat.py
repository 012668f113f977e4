"""The heartbeat: renews the client lease and applies the control state each renewal returns."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_hopper.engine.params import ClientRenewParams
from django_hopper.worker.db import (
    Backoff,
    ConnectionWatch,
    close_thread_connections,
    reset_connection,
)

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.maintenance.leader import Maintainer
    from django_hopper.worker.control import ControlState

logger = logging.getLogger("django_hopper.worker")


class Heartbeat:
    """Renews the client lease and applies the control state the renewal returns.

    ``register`` takes a new lease (the worker's, which records its queues);
    ``running`` says how many attempts are still executing, so that a fenced
    worker registers again only once they have all ended.
    """

    def __init__(
        self,
        engine: BaseEngine,
        control: ControlState,
        *,
        register: Callable[[], int],
        running: Callable[[], int],
        client_ttl: float,
        interval: float,
        maintainer: Maintainer | None = None,
        completed: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.engine = engine
        self.control = control
        self.register = register
        self.running = running
        self.client_ttl = client_ttl
        self.interval = interval
        self.maintainer = maintainer
        self.completed = completed
        self.last_renewed = time.monotonic()

    def run_once(self) -> bool:
        """Renew once; return whether the lease was renewed.

        A renewal that says ``renewed=False`` means the lease had expired and
        the rescue may already have taken this client's jobs: the worker is
        fenced. While fenced, each run waits for the running jobs to end and
        then registers a new lease, so the process works again.
        """
        control = self.control
        if control.fenced:
            if not self.running():
                self.register()
                control.fenced = False
                logger.warning(
                    "registered again as client %s after being fenced", control.client_id
                )
            return False
        if control.client_id is None:
            return False
        ttl = dt.timedelta(seconds=self.client_ttl)
        completed = self.completed() if self.completed is not None else None
        result = self.engine.client_renew(
            ClientRenewParams(client_id=control.client_id, ttl=ttl, completed=completed)
        )
        if not result.renewed:
            self.fence()
            return False
        self.last_renewed = time.monotonic()
        control.suspended = False
        control.apply(result.cancel_requested, result.paused_queues, result.limited_queues)
        if self.maintainer is not None:
            self.maintainer.register()
        return True

    def fence(self) -> None:
        """Stop claiming: the lease expired, so the rescue may own our jobs now.

        Results of the jobs still running are refused by the fence when they
        arrive; once they have all ended, the heartbeat registers a new lease.
        """
        control = self.control
        if not control.fenced:
            logger.error(
                "client %s was fenced (its lease expired): claiming stopped; "
                "results of its %d running jobs will be refused",
                control.client_id,
                self.running(),
            )
        control.fenced = True
        if self.maintainer is not None:
            self.maintainer.elector.is_leader = False

    def run(self) -> None:
        """Renew every HEARTBEAT_INTERVAL; stop claiming while the lease may have expired."""
        control = self.control
        interval = self.interval
        ttl = self.client_ttl
        delay = Backoff(0.1, max(interval / 2, 0.1))
        watch = ConnectionWatch("renewing the client lease")
        try:
            while not control.stopping_hard.is_set():
                try:
                    self.run_once()
                    delay.reset()
                    watch.ok()
                    wait = interval
                except Exception as exc:
                    reset_connection(self.engine.alias)
                    wait = min(delay.next(), interval)
                    if time.monotonic() - self.last_renewed > ttl and not control.suspended:
                        control.suspended = True
                        logger.error("client lease not renewed for %.1fs: claiming paused", ttl)
                    watch.failed(exc)
                control.renew.wait(wait)
                control.renew.clear()
        finally:
            close_thread_connections()
