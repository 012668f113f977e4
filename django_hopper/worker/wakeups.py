"""Stream wake-ups within one process, for engines without notifications (SQLite).

PostgreSQL tells every worker about an append through ``CHANNEL_STREAM``.
SQLite has no notifications, so the leader's round pumps every
``MAINTENANCE_INTERVAL``; but an append made in the leader's own process (a
job that appends the next event of a chain) reaches the leader's
:class:`~django_hopper.maintenance.leader.Maintainer` here, at commit, without
waiting for the round. Like :mod:`.declarations`, this module imports
nothing, so ``streams`` calls it without loading the runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_listeners: list[Callable[[str], None]] = []
_lock = threading.Lock()


def listen(callback: Callable[[str], None]) -> None:
    """Call ``callback(topic)`` for every append this process commits."""
    with _lock:
        _listeners.append(callback)


def unlisten(callback: Callable[[str], None]) -> None:
    """Stop calling ``callback`` (a maintainer that stopped)."""
    with _lock:
        if callback in _listeners:
            _listeners.remove(callback)


def stream_appended(topic: str) -> None:
    """Tell this process's maintainers that an append of ``topic`` committed."""
    with _lock:
        listeners = list(_listeners)
    for callback in listeners:
        callback(topic)
