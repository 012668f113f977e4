"""The leader's service contract: one class per duty, one interval per class."""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine


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
