"""Watching hopper: console lines, OpenTelemetry traces and metrics, Prometheus.

Everything here is built on the signals of :mod:`django_hopper.signals`, the
hooks a project has too. One pair of receivers per signal fans out to the
*sinks* that are on in this process (:class:`Sink` subclasses): the worker's
console lines (:mod:`.console`), tracing (:mod:`.tracing`), OpenTelemetry
metrics and Prometheus (:mod:`.metrics`). A receiver is connected only while
some sink wants its signal, so a process where nothing watches pays nothing
per job: the senders skip a signal without receivers.

Tracing and metrics turn on by themselves when their packages are installed
(``django-hopper[otel]``, ``django-hopper[prometheus]``); ``HOPPER["TRACING"]``
and ``HOPPER["METRICS"]`` set to False turn them off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

from django_hopper import signals
from django_hopper.conf import hopper_settings

if TYPE_CHECKING:
    from django.dispatch import Signal

    from django_hopper.engine.params import JobInsertParams
    from django_hopper.types import JobRow
    from django_hopper.worker import Worker

__all__ = ["Sink", "add_sink", "remove_sink", "setup", "sinks"]


class Sink:
    """Something that watches jobs; override the events you want.

    ``wants`` names the events a sink handles; the hub connects a signal's
    receiver only while a sink wants it. Methods run inside the sender (a job
    thread, the enqueuing request): keep them cheap. An exception is logged
    and never reaches the job.
    """

    #: The events this sink handles (names of the methods below).
    wants: frozenset[str] = frozenset()

    def enqueuing(self, sender: Any, params: Sequence[JobInsertParams]) -> Mapping[str, Any] | None:
        """Return metadata to store with every job about to be inserted, or None."""
        return None

    def enqueued(self, sender: Any, jobs: Sequence[JobRow], duplicates: Sequence[JobRow]) -> None:
        """Handle jobs just inserted (inside the caller's transaction)."""

    def started(self, job: JobRow) -> None:
        """Handle an attempt about to run, in the thread (or task) that runs it."""

    def finished(
        self, job: JobRow, state: str, error: BaseException | str | None, duration: float | None
    ) -> None:
        """Handle an attempt's result; ``duration`` in seconds (None if its start was unseen)."""

    def ended(self, jobs: Sequence[JobRow]) -> None:
        """Handle jobs ended outside any attempt (expiry, rescue, cancel of a waiting job)."""

    def rescued(self, jobs: Sequence[JobRow]) -> None:
        """Handle attempts the rescue took back (``state`` is what they became)."""

    def worker_started(self, worker: Worker) -> None:
        """Handle a worker that registered and is about to claim."""

    def worker_stopped(self, worker: Worker) -> None:
        """Handle a worker that stopped."""


_lock = threading.Lock()
_sinks: list[Sink] = []
#: Attempt start times (perf_counter) by the identity of the attempt's job
#: object (the worker sends both signals of an attempt with the same one), with
#: that object: an int key hashes in C, where a job ID's hash is a Python call,
#: and the entry keeps its object, so no other object takes its identity.
_starts: dict[int, tuple[Any, float]] = {}


def sinks() -> list[Sink]:
    """Return the sinks on in this process."""
    return list(_sinks)


#: Event name -> the bound methods of the sinks that want it, in the order the
#: sinks were added; rebuilt when a sink is added or removed, so that an event
#: costs one call per interested sink and no lookups.
_handlers: dict[str, tuple[Any, ...]] = {}
#: ``_handlers["started"]`` and ``_handlers["finished"]``, read per attempt
#: without the dict's lookup.
_started_handlers: tuple[Any, ...] = ()
_finished_handlers: tuple[Any, ...] = ()


def _failed(handler: Any) -> None:
    logging.getLogger("django_hopper.observability").exception(
        "%s.%s failed",
        type(getattr(handler, "__self__", handler)).__name__,
        getattr(handler, "__name__", "?"),
    )


def _call(method: str, *args: Any) -> list[Any]:
    out = []
    for handler in _handlers.get(method, ()):
        try:
            out.append(handler(*args))
        except Exception:
            _failed(handler)
    return out


def _on_enqueuing(sender: Any, params: Sequence[JobInsertParams], **kwargs: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for extra in _call("enqueuing", sender, params):
        if extra:
            merged.update(extra)
    return merged


def _on_enqueued(
    sender: Any, jobs: Sequence[JobRow], duplicates: Sequence[JobRow] = (), **kwargs: Any
) -> None:
    _call("enqueued", sender, jobs, duplicates)


def _on_started(sender: Any, job: JobRow, **kwargs: Any) -> None:
    _attempt_started(sender, job)


def _attempt_started(sender: Any, job: JobRow) -> None:
    # Per attempt, in the job's thread: no result list, no lookups; called
    # directly with the worker's arguments (no keyword dictionary) while the
    # hub is the signal's only receiver.
    _starts[id(job)] = (job, perf_counter())
    for handler in _started_handlers:
        try:
            handler(job)
        except Exception:
            _failed(handler)


def _on_finished(
    sender: Any,
    job: JobRow,
    state: str,
    error: BaseException | str | None = None,
    output: Any = None,
    **kwargs: Any,
) -> None:
    _attempt_finished(sender, job, state, error, output)


def _attempt_finished(
    sender: Any,
    job: JobRow,
    state: str,
    error: BaseException | str | None = None,
    output: Any = None,
) -> None:
    start = _starts.pop(id(job), None)
    duration = None if start is None else perf_counter() - start[1]
    for handler in _finished_handlers:
        try:
            handler(job, state, error, duration)
        except Exception:
            _failed(handler)


def _on_ended(sender: Any, jobs: Sequence[JobRow], **kwargs: Any) -> None:
    _call("ended", jobs)


def _on_rescued(sender: Any, jobs: Sequence[JobRow], **kwargs: Any) -> None:
    _call("rescued", jobs)


def _on_worker_started(sender: Any, worker: Worker, **kwargs: Any) -> None:
    _call("worker_started", worker)


def _on_worker_stopped(sender: Any, worker: Worker, **kwargs: Any) -> None:
    _call("worker_stopped", worker)


#: Event name -> (signal, receiver). ``finished`` needs ``started`` for durations
#: only; a sink that wants durations wants ``started`` too.
_RECEIVERS: dict[str, tuple[Signal, Any]] = {
    "enqueuing": (signals.job_enqueuing, _on_enqueuing),
    "enqueued": (signals.job_enqueued, _on_enqueued),
    "started": (signals.job_started, _on_started),
    "finished": (signals.job_finished, _on_finished),
    "ended": (signals.jobs_ended, _on_ended),
    "rescued": (signals.jobs_rescued, _on_rescued),
    "worker_started": (signals.worker_started, _on_worker_started),
    "worker_stopped": (signals.worker_stopped, _on_worker_stopped),
}


#: What the per-attempt signals call directly (see ``signals.connect_direct``).
_POSITIONAL: dict[str, Callable[..., Any]] = {
    "started": _attempt_started,
    "finished": _attempt_finished,
}


def _rewire() -> None:
    global _started_handlers, _finished_handlers
    wanted = set().union(*(s.wants for s in _sinks)) if _sinks else set()
    _handlers.clear()
    for event in _RECEIVERS:
        _handlers[event] = tuple(getattr(s, event) for s in _sinks if event in s.wants)
    _started_handlers, _finished_handlers = _handlers["started"], _handlers["finished"]
    for event, (signal, receiver) in _RECEIVERS.items():
        uid = f"django_hopper.observability.{event}"
        if event in wanted:
            # The per-attempt signals reach their hub functions with the
            # worker's arguments in order.
            signals.connect_direct(signal, receiver, uid, positional=_POSITIONAL.get(event, False))
        else:
            signals.disconnect_direct(signal, uid)
    if "started" not in wanted:
        _starts.clear()


def add_sink(sink: Sink) -> Sink:
    """Turn a sink on in this process (idempotent per sink object)."""
    with _lock:
        if sink not in _sinks:
            _sinks.append(sink)
            _rewire()
    return sink


def remove_sink(sink: Sink) -> None:
    """Turn a sink off."""
    with _lock:
        if sink in _sinks:
            _sinks.remove(sink)
            _rewire()


_setup_done = False


def setup() -> None:
    """Turn on tracing and metrics as settings and installed packages allow.

    Called from the app's ``ready()`` in every process, so that enqueues in
    web processes are traced and counted as well as attempts in workers.
    """
    global _setup_done
    if _setup_done:
        return
    _setup_done = True

    if hopper_settings.TRACING is not False:
        from django_hopper.observability import tracing  # noqa: PLC0415 - import cycle: tracing imports Sink from this package

        if tracing.available():
            add_sink(tracing.TracingSink())
    if hopper_settings.METRICS is not False:
        from django_hopper.observability import metrics  # noqa: PLC0415 - import cycle: metrics imports Sink from this package

        metrics.setup()
