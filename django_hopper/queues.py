"""Queue controls for operators and user code: pause, resume, limits, ordering
keys and stats (docs/queue-controls.md).

Each function about one queue runs on the Django connection of the alias the
queue lives on (``HOPPER["QUEUE_DATABASES"]``, else ``HOPPER["DATABASE"]``:
where its workers read its pause and limits), so it joins the caller's
transaction there, and the rule it applies is written once, in the engine
(and :mod:`django_hopper.engine.limits`). ``list_queues`` and ``stats`` read
every alias.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django_hopper import topology, validation
from django_hopper.engine import get_engine
from django_hopper.engine.limits import validate_limits
from django_hopper.engine.params import JobRetryOrderingKeyParams, StatsBoundedParams
from django_hopper.exceptions import InvalidJob
from django_hopper.types import QueueLimits

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import QueueLimits, QueueRow, Stats

__all__ = [
    "list_queues",
    "pause_queue",
    "resume_queue",
    "retry_ordering_key",
    "set_queue_limits",
    "stats",
]


def _engine(queue: str) -> BaseEngine:
    """Return the engine of the alias ``queue`` lives on."""
    return get_engine(topology.queue_alias(queue))


def pause_queue(name: str) -> None:
    """Stop every worker claiming from ``name`` (at once on PostgreSQL, at the
    next lease renewal on SQLite); running jobs finish. Creates the queue if unknown."""
    name = validation.queue_name(name, "name")
    _engine(name).queue_pause(name)


def resume_queue(name: str) -> None:
    """Let workers claim from ``name`` again."""
    name = validation.queue_name(name, "name")
    _engine(name).queue_resume(name)


def _seconds(value: Any, field: str) -> dt.timedelta:
    """Return a non-negative duration (numbers are seconds) or raise naming ``field``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = dt.timedelta(seconds=value)
    if not isinstance(value, dt.timedelta) or value < dt.timedelta(0):
        raise InvalidJob(f"{field} must be a non-negative duration, not {value!r}", field=field)
    return value


def check_queue_limits(
    name: str,
    *,
    rate_per_sec: float = 0,
    burst: int | None = None,
    global_limit: int = 0,
    partition_limit: int = 0,
    aging: dt.timedelta | float = 0,
) -> QueueLimits:
    """Return the limits ``set_queue_limits`` would store, or raise InvalidJob naming the field.

    Writes nothing, so a form can check each value on its own and show every
    error at once with the rules ``set_queue_limits`` applies.
    """

    if burst is not None:
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
            raise InvalidJob(f"burst must be a non-negative integer, not {burst!r}", field="burst")
        if burst == 0 and rate_per_sec:
            raise InvalidJob(
                "burst must be at least 1 with a rate limit (leave it out for one second's worth)",
                field="burst",
            )
    limits = QueueLimits(
        name=validation.queue_name(name, "name"),
        global_limit=global_limit,
        rate_per_sec=rate_per_sec,
        rate_burst=burst or 0,
        partition_limit=partition_limit,
        aging=_seconds(aging, "aging"),
    )
    return validate_limits(limits)


def set_queue_limits(
    name: str,
    *,
    rate_per_sec: float = 0,
    burst: int | None = None,
    global_limit: int = 0,
    partition_limit: int = 0,
    aging: dt.timedelta | float = 0,
) -> QueueRow:
    """Set a queue's cluster-wide limits and return its row; zero removes a limit.

    ``rate_per_sec`` caps claims per second with a bucket of ``burst`` tokens
    (default: one second's worth; a burst needs a rate); ``global_limit`` caps
    running jobs across all workers; ``partition_limit`` caps running jobs per
    ``partition_key``; ``aging`` (seconds or a timedelta) raises a waiting
    job's priority one level per interval waited. Every call replaces all five
    settings.
    """
    limits = check_queue_limits(
        name,
        rate_per_sec=rate_per_sec,
        burst=burst,
        global_limit=global_limit,
        partition_limit=partition_limit,
        aging=aging,
    )
    return _engine(limits.name).queue_set_limits(limits)


def list_queues() -> list[QueueRow]:
    """Return every known queue with its pause and limits, each from its own alias."""

    aliases = topology.aliases()
    if len(aliases) == 1:
        return get_engine(aliases[0]).queue_list()
    rows: dict[str, QueueRow] = {}
    for alias in aliases:
        for row in get_engine(alias).queue_list():
            if row.name not in rows or topology.queue_alias(row.name) == alias:
                rows[row.name] = row
    return sorted(rows.values(), key=lambda row: row.name)


def retry_ordering_key(queue: str, key: str, *, limit: int = 1000) -> int:
    """Wake an ordering key: up to ``limit`` of its jobs waiting on a retry or a
    snooze run now (keeping their TTL), and a running one that snoozes or fails
    next runs again at once. Returns how many waiting jobs were woken."""

    return _engine(queue).job_retry_ordering_key(
        JobRetryOrderingKeyParams(queue=queue, ordering_key=key, limit=limit)
    )


def stats(limit: int | None = None) -> Stats:
    """Return per-queue depths and the cluster's state (clients, leader, running).

    With ``limit``, each count of a queue's jobs in a state stops at that
    many (``QueueStats.capped`` names the states that reached it), so the
    read costs the same however many jobs are live: for pages reloaded
    every few seconds. Without, every count is exact and the read is
    proportional to the live jobs: for metrics.

    With queues on several aliases: each queue's depths from its own alias,
    the live clients of every alias summed; the leader and the running jobs
    by client are those of ``HOPPER["DATABASE"]`` (client IDs are numbered
    per database). One query per alias.
    """
    aliases = topology.aliases()

    def read(alias: str) -> Stats:
        engine = get_engine(alias)
        if limit is None:
            return engine.stats()
        return engine.stats_bounded(StatsBoundedParams(limit=limit))

    merged = read(aliases[0])
    for alias in aliases[1:]:
        other = read(alias)
        for name, depth in other.queues.items():
            if name not in merged.queues or topology.queue_alias(name) == alias:
                merged.queues[name] = depth
        merged.live_clients += other.live_clients
    return merged
