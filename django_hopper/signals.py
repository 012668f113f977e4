"""Signals hopper sends around a job's life, for metrics, auditing and tests.

Receivers run synchronously in the sending thread; keep them cheap and do not
let them raise (an exception propagates to the sender, as with any Django
signal sent by ``send``).

``job_enqueuing`` is sent right before jobs are inserted: a receiver may
return a mapping that is merged into every job's ``metadata`` (tracing stores
its trace context this way). ``job_enqueued`` is sent right after the insert,
*inside* the caller's transaction: if that transaction later rolls back, the
jobs never existed. A receiver that must act only on committed jobs wraps its
work in ``transaction.on_commit``.

``job_started`` and ``job_finished`` are sent by the worker (with
``send_robust``: a failing receiver is logged, never fails the job), before an
attempt and once its result is written. ``jobs_ended`` is sent (robustly too)
for jobs hopper ends with no attempt to announce them, and ``jobs_rescued``
for the attempts the rescue took back from a dead or stuck worker.
``worker_started`` and ``worker_stopped`` bracket a worker's life.

:mod:`django_hopper.observability` (console lines, OpenTelemetry tracing and
metrics, Prometheus) is built on these same signals: a project adds Sentry or
its own metrics by connecting receivers the same way (docs/observability.md).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_hopper")

#: Signal -> (its receiver list entry's lookup key, the receiver, what
#: :func:`send_positional` calls with the signal's arguments in order, or
#: None) of a receiver connected with :func:`connect_direct`.
_direct: dict[Signal, tuple[Any, Callable[..., Any], Callable[..., Any] | None]] = {}


def connect_direct(
    signal: Signal,
    receiver: Callable[..., Any],
    dispatch_uid: str,
    *,
    positional: bool | Callable[..., Any] = False,
) -> None:
    """Connect ``receiver`` for every sender; call it directly while it listens alone.

    While it is the signal's only receiver, :func:`send_logged` calls it
    without Django's dispatch (a lock, a scan of the receivers for the
    sender, the sync/async split): per attempt, that dispatch costs more
    than a cheap receiver itself. Any other receiver connected restores the
    ordinary dispatch for every receiver. An exception is logged, as from
    ``send_robust``.

    ``positional``: True when the receiver also takes ``(sender, *arguments)``
    in the order :func:`send_positional` sends them, so a per-attempt signal
    reaches it without building keyword dictionaries; or the function that
    takes them so in the receiver's stead (one without the ``**kwargs`` a
    receiver needs, whose empty dictionary each call would make).
    """
    signal.connect(receiver, dispatch_uid=dispatch_uid, weak=False)
    key = next(entry[0] for entry in signal.receivers if entry[0][0] == dispatch_uid)
    direct = receiver if positional is True else (positional or None)
    _direct[signal] = (key, receiver, direct)


def disconnect_direct(signal: Signal, dispatch_uid: str) -> None:
    """Disconnect a receiver connected with :func:`connect_direct`."""
    signal.disconnect(dispatch_uid=dispatch_uid)
    direct = _direct.get(signal)
    if direct is not None and direct[0][0] == dispatch_uid:
        del _direct[signal]


def send_logged(signal: Signal, sender: Any = None, **kwargs: Any) -> None:
    """Send ``signal`` robustly: log each receiver's error instead of raising it.

    Hopper sends from places a receiver's bug must not break (a job's
    attempt, a maintenance pass, a commit hook). Free when nothing listens,
    which is the common case.
    """
    # Up to two entries in one step: another thread may disconnect a receiver
    # between two reads of the list (Django deletes the entry in place).
    alone = signal.receivers[:2]
    if not alone:
        return
    if len(alone) == 1:
        direct = _direct.get(signal)
        if direct is not None and alone[0][0] == direct[0]:
            try:
                direct[1](signal=signal, sender=sender, **kwargs)
            except Exception as exc:
                logger.error("a signal receiver %r failed: %s", direct[1], exc)
            return
    for receiver, outcome in signal.send_robust(sender=sender, **kwargs):
        if isinstance(outcome, Exception):
            logger.error("a signal receiver %r failed: %s", receiver, outcome)


def send_positional(signal: Signal, sender: Any, *args: Any) -> None:
    """Send a per-attempt signal as :func:`send_logged` does, its arguments in order.

    ``job_started``: ``job``; ``job_finished``: ``job, state, error, output``.
    A direct receiver that takes them positionally (:func:`connect_direct`)
    is called with ``(sender, *args)``; any other receiver gets them by name.
    """
    alone = signal.receivers[:2]  # in one step, as send_logged reads it
    if not alone:
        return
    if len(alone) == 1:
        direct = _direct.get(signal)
        if direct is not None and direct[2] is not None and alone[0][0] == direct[0]:
            try:
                direct[2](sender, *args)
            except Exception as exc:
                logger.error("a signal receiver %r failed: %s", direct[1], exc)
            return
    send_logged(signal, sender, **dict(zip(_POSITIONAL[signal], args, strict=True)))


def enqueuing(sender: Any, params: list[Any]) -> list[Any]:
    """Send ``job_enqueuing`` for jobs about to be inserted; return their params.

    The mappings receivers return are merged into each job's metadata (a copy:
    the caller's params are left alone). Free when nothing listens.
    """
    if not job_enqueuing.receivers:
        return params
    extra: dict[str, Any] = {}
    for receiver, outcome in job_enqueuing.send_robust(sender=sender, params=params):
        if isinstance(outcome, Exception):
            logger.error("a signal receiver %r failed: %s", receiver, outcome)
        elif isinstance(outcome, dict):
            extra.update(outcome)
    if not extra:
        return params
    return [dataclasses.replace(p, metadata={**(p.metadata or {}), **extra}) for p in params]


#: Sent before ``enqueue`` / ``enqueue_many`` / ``Workflow.enqueue`` /
#: ``Batch.enqueue`` insert jobs, in the caller's thread and context.
#:
#: * ``sender``: the :class:`~django_hopper.jobs.JobFunction` that enqueues
#:   (``None`` for a workflow or batch of several functions).
#: * ``params``: list of :class:`~django_hopper.engine.params.JobInsertParams`
#:   about to be inserted (read them; do not change them).
#:
#: A receiver may return a ``dict`` of JSON values: its keys are merged into
#: the ``metadata`` of every job of the call. Sent only when someone listens.
job_enqueuing = Signal()

#: Sent after ``enqueue`` / ``enqueue_many`` / ``Workflow.enqueue`` /
#: ``Batch.enqueue`` inserted jobs.
#:
#: * ``sender``: the :class:`~django_hopper.jobs.JobFunction` that enqueued
#:   (a ``using(...)`` copy is its own sender; None for a workflow or batch).
#:   ``django_hopper.enqueue_many`` and ``fn.enqueue_many`` with prepared jobs
#:   send once per distinct job function among their items, each with that
#:   function's jobs.
#: * ``jobs``: list of :class:`~django_hopper.types.JobRow`, the jobs
#:   inserted by this call, as inserted.
#: * ``duplicates``: list of ``JobRow``, existing jobs returned instead of
#:   inserting because their unique key matched (empty for most calls).
job_enqueued = Signal()

#: Sent by the worker before an attempt runs the job's function.
#:
#: * ``sender``: None (use ``job.kind``, or ``jobs.resolve(job.kind)``).
#: * ``job``: the ``JobRow`` as claimed (``attempt`` is this attempt's number).
job_started = Signal()

#: Sent by the worker once an attempt's result is written. A result the fence
#: refused (the attempt had lost the job) is not announced.
#:
#: * ``sender``: None (use ``job.kind``).
#: * ``job``: the ``JobRow`` as claimed.
#: * ``state``: the state the attempt led to: ``completed``, ``retryable``,
#:   ``scheduled`` (snoozed), ``canceled`` or ``discarded``.
#: * ``error``: the attempt's error message (``str``), or None.
#: * ``output``: the function's JSON return value when completed, else None.
job_finished = Signal()

#: Sent when hopper ends jobs outside any attempt: the rescue of a dead or
#: stuck worker's attempt when it ends the job (no attempt left, or a cancel
#: was requested), TTL expiry, job-lease expiry, the cancel of a waiting
#: job (once the cancel commits), and the final outcome a job lease holder
#: reported (``lease_job``, ``claim_job``: once it commits). Sent in the
#: process that ended them (the leader's, for the services), never for a job
#: a worker's attempt announces.
#:
#: * ``sender``: None.
#: * ``jobs``: list of ``JobRow``, as ended (``canceled`` or ``discarded``,
#:   their errors recorded; ``completed`` with its output for a lease holder's
#:   completion).
jobs_ended = Signal()

#: Sent by the rescue (in the leader's process) for the attempts it ended
#: because their worker died or they were stuck, whatever state that led to
#: (``retryable``, ``discarded`` or ``canceled``).
#:
#: * ``sender``: None.
#: * ``jobs``: list of ``JobRow`` as they were claimed (``attempt`` is the
#:   rescued attempt's number), each with ``state`` set to its new state.
jobs_rescued = Signal()

#: Sent once a worker registered its client lease and is about to claim.
#:
#: * ``sender``: None.
#: * ``worker``: the :class:`~django_hopper.worker.Worker` (its ``client_id``,
#:   ``config.queues``, ``engine``, ``config.maintenance``).
worker_started = Signal()

#: Sent once a worker stopped and deleted its client lease.
#:
#: * ``sender``: None.
#: * ``worker``: the :class:`~django_hopper.worker.Worker`.
worker_stopped = Signal()


#: The arguments :func:`send_positional` sends, in order, by signal.
_POSITIONAL: dict[Signal, tuple[str, ...]] = {
    job_started: ("job",),
    job_finished: ("job", "state", "error", "output"),
}
