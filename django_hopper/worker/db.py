"""Django connection hygiene for the runtime's long-lived threads.

Django opens one connection per thread and alias. A worker thread lives for
the life of the process, so it must close its connection itself: when it ends,
and after an error that may have broken it (a restarted server, a terminated
backend), so that the next call reconnects instead of failing forever.
"""

from __future__ import annotations

import logging
import time

from django.db import connections

logger = logging.getLogger("django_hopper.worker")


def close_thread_connections() -> None:
    """Close this thread's connections (``connections`` is per thread)."""
    try:
        connections.close_all()
    except Exception:  # closing a broken connection must not mask the real error
        logger.debug("closing a connection failed", exc_info=True)


def reset_connection(alias: str) -> None:
    """Drop this thread's connection of ``alias`` after an error, so the next call reconnects.

    Never inside an atomic block: there the caller's transaction owns the
    connection and must see the error itself.
    """
    try:
        conn = connections[alias]
        if not conn.in_atomic_block:
            conn.close()
    except Exception:
        logger.debug("closing a connection failed", exc_info=True)


class Backoff:
    """Grow a retry delay after each failure; reset it after a success."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.current = first

    def next(self) -> float:
        """Return the delay to wait now, and double the next one (up to the cap)."""
        delay = self.current
        self.current = min(self.current * 2, self.cap)
        return delay

    def reset(self) -> None:
        """Start again from the first delay."""
        self.current = self.first


class ConnectionWatch:
    """Say once that the database was lost, and once that it came back.

    A loop that retries a database call every few hundred milliseconds would
    otherwise print a traceback per retry; the console shows one line when
    the first call fails (the traceback at DEBUG) and one when a call works
    again, with how long the database was away.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.lost_at: float | None = None

    def failed(self, exc: BaseException) -> None:
        """Record a failed call: a WARNING the first time, DEBUG after that."""
        if self.lost_at is None:
            self.lost_at = time.monotonic()
            logger.warning("lost the database connection (%s): %s", self.what, exc)
        logger.debug("%s failed", self.what, exc_info=exc)

    def ok(self) -> None:
        """Record a call that worked: an INFO line if the database was lost."""
        if self.lost_at is not None:
            away = time.monotonic() - self.lost_at
            self.lost_at = None
            logger.info("database connection regained (%s) after %.1fs", self.what, away)
