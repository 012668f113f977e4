"""The leader's service contract: one class per duty, one interval per class."""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine


#: The first run of the live-table upkeep (vacuum and analyze) and of stream
#: retention comes this many seconds after a maintainer starts leading, not in
#: its first round. A leader takes office as its workers start, often in front
#: of a backlog: on a fresh database its first vacuum and analyze of the live
#: table took ~150 ms of the database's time in the first second the workers
#: claimed. No job waits for either (autovacuum runs meanwhile). History
#: partitions are still made in the first round, so that a fresh install's first
#: day gets its partition before anything is finalized into DEFAULT; the services
#: that move jobs (rescue, schedule, expiry, leases, workflows, periodic) run at once.
UPKEEP_FIRST_DELAY = 10.0


class Service(ABC):
    """A periodic duty of the leader.

    :attr:`interval` is the service's only schedule: the maintainer runs it
    when that many seconds have passed since its last round (its loop,
    ``MAINTENANCE_INTERVAL``, bounds it from below). A subclass sets it as a
    class attribute; an instance may override it.
    """

    #: A short name for logs and ``hopper_maintain`` output.
    name: str = ""
    #: Seconds between runs (0: every maintenance round).
    interval: float = 1.0
    #: Seconds after a maintainer starts leading before the service's first run
    #: (0: in its first round). Upkeep no job waits for sets UPKEEP_FIRST_DELAY.
    first_delay: float = 0.0

    def __init__(self, engine: BaseEngine) -> None:
        self.engine = engine

    @abstractmethod
    def run_once(self, now: dt.datetime | None = None) -> int:
        """Do one round of work; return how many rows it changed."""

    def close(self, timeout: float | None = 10.0) -> None:  # noqa: B027 (a no-op hook by design)
        """Wait for work the service started in the background (none by default).

        ``timeout=None`` waits as long as it takes (``hopper_maintain --once``,
        whose exit would otherwise kill the work).
        """
