"""Signals hopper sends around a job's life, for metrics, auditing and tests.

Receivers run synchronously in the sending thread; keep them cheap and do not
let them raise (an exception propagates to the sender, as with any Django
signal sent by ``send``).

``job_enqueued`` is sent by :mod:`django_hopper.jobs` right after the insert,
*inside* the caller's transaction: if that transaction later rolls back, the
jobs never existed. A receiver that must act only on committed jobs wraps its
work in ``transaction.on_commit``.

``job_started`` and ``job_finished`` are sent by the worker (with
``send_robust``: a failing receiver is logged, never fails the job), before an
attempt and once its result is written. ``jobs_ended`` is sent (robustly too)
for jobs hopper ends with no attempt to announce them.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_hopper")


def send_logged(signal: Signal, sender: Any = None, **kwargs: Any) -> None:
    """Send ``signal`` robustly: log each receiver's error instead of raising it.

    Hopper sends from places a receiver's bug must not break (a job's
    attempt, a maintenance pass, a commit hook). Free when nothing listens,
    which is the common case.
    """
    if not signal.receivers:
        return
    for receiver, outcome in signal.send_robust(sender=sender, **kwargs):
        if isinstance(outcome, Exception):
            logger.error("a signal receiver %r failed: %s", receiver, outcome)


#: Sent after ``enqueue`` / ``enqueue_many`` inserted jobs.
#:
#: * ``sender``: the :class:`~django_hopper.jobs.JobFunction` that enqueued
#:   (a ``using(...)`` copy is its own sender). ``django_hopper.enqueue_many``
#:   and ``fn.enqueue_many`` with prepared jobs send once per distinct job
#:   function among their items, each with that function's jobs.
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
#: was requested), TTL expiry, job-lease expiry, and the cancel of a waiting
#: job (once the cancel commits). Sent in the process that ended them (the
#: leader's, for the services), never for a job an attempt announces.
#:
#: * ``sender``: None.
#: * ``jobs``: list of ``JobRow``, as ended (``canceled`` or ``discarded``,
#:   their errors recorded).
jobs_ended = Signal()
