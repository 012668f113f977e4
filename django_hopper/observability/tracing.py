"""OpenTelemetry tracing: a span per enqueue and per attempt, in one trace.

On ``opentelemetry-api`` (``pip install django-hopper[otel]``); without it this
module does nothing and nothing is connected. Configure an SDK (a
``TracerProvider`` and an exporter) as for any OpenTelemetry application;
without one the API's no-op tracer records nothing and hopper stores nothing.

* ``enqueue {kind}`` (PRODUCER) wraps each enqueue call, a child of the
  current span (the request's, with Django instrumentation). Its context is
  stored with the jobs, in ``metadata["otel"]`` (W3C ``traceparent``), so the
  trace survives the database.
* ``run {kind}`` (CONSUMER) covers one attempt, from its claim (the
  database's ``attempted_at``) to its result, with a ``started`` event when
  the job's function starts (the time between is the wait in the worker). It
  is current while the function runs, so spans the job makes (queries, HTTP
  calls, jobs it enqueues) are its children. A failed attempt records its
  exception and an error status.

Each attempt's span is a child of the enqueue span, so every
retry, and every step of a workflow enqueued in one call, lands in the trace
of the request that enqueued it. Attributes follow the OpenTelemetry messaging
semantic conventions (``messaging.system``, ``messaging.destination.name``,
``messaging.operation.type``, ``messaging.message.id``) plus
``hopper.job.kind`` and ``hopper.job.attempt``: few, since each attribute
costs every attempt. One span per attempt, not one per claim and one per run,
for the same reason.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django_hopper import __version__
from django_hopper.observability import Sink

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
    )

    #: The parent of a trace's first span: an empty context.
    _ROOT = otel_context.Context()
except ImportError:  # pragma: no cover - the extra is not installed
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django_hopper.engine.params import JobInsertParams
    from django_hopper.types import JobRow

#: The metadata key the enqueue span's context is stored under.
METADATA_KEY = "otel"
SYSTEM = "django_hopper"


def available() -> bool:
    """Return whether ``opentelemetry-api`` is installed."""
    return trace is not None


def _drops_unsampled_parents(provider: Any) -> bool:
    """Return whether ``provider`` samples with the SDK's ``ParentBased`` that drops
    the children of an unsampled remote parent (its default), asked once by a probe."""
    try:
        from opentelemetry.sdk.trace.sampling import Decision, ParentBased  # noqa: PLC0415 - optional: the SDK may be absent
    except ImportError:
        return False
    sampler = getattr(provider, "sampler", None)
    if not isinstance(sampler, ParentBased):
        return False
    probe = NonRecordingSpan(
        SpanContext(trace_id=1, span_id=1, is_remote=True, trace_flags=TraceFlags(0))
    )
    result = sampler.should_sample(trace.set_span_in_context(probe), trace_id=1, name="probe")
    return result.decision is Decision.DROP


def _stored_parent(carrier: dict[str, Any]) -> Any:
    """Return the span context of a carrier that is a bare W3C ``traceparent``, else None.

    What hopper's enqueue span stores with the default propagators; parsed
    here directly (the propagator's regular expression and baggage pass cost
    every attempt). Anything else (a ``tracestate``, baggage, another
    propagator's fields) is left to ``propagate.extract``.
    """
    parent = carrier.get("traceparent")
    if len(carrier) != 1 or not isinstance(parent, str) or len(parent) != 55:
        return None
    if parent[:3] != "00-" or parent[35] != "-" or parent[52] != "-":
        return None
    try:
        context = SpanContext(
            trace_id=int(parent[3:35], 16),
            span_id=int(parent[36:52], 16),
            is_remote=True,
            trace_flags=TraceFlags(int(parent[53:55], 16)),
        )
    except ValueError:
        return None
    return context if context.is_valid else None


def _ns(at: dt.datetime | None, ceiling: int) -> int:
    if at is None:
        return ceiling
    return min(int(at.timestamp() * 1e9), ceiling)


class TracingSink(Sink):
    """Make the spans; ``tracer_provider`` defaults to the global one."""

    wants = frozenset({"enqueuing", "enqueued", "started", "finished"})

    def __init__(self, tracer_provider: Any = None) -> None:

        self.tracer = trace.get_tracer(
            "django_hopper", __version__, tracer_provider=tracer_provider
        )
        self._provider = tracer_provider
        #: (the provider asked, whether its sampler drops every child of an
        #: unsampled remote parent): asked once per provider.
        self._drops: tuple[Any, bool] = (None, False)
        #: Enqueue spans opened by ``enqueuing``, closed by ``enqueued``.
        self._enqueues: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            f"hopper_enqueue_spans_{id(self)}", default=()
        )
        #: (queue, kind, attempt) -> an attempt span's name and attributes.
        self._descriptions: dict[tuple[str, str, int], tuple[str, Mapping[str, Any]]] = {}
        #: (job ID, fence) -> (recorded run span, the thread that started it).
        self._running: dict[tuple[Any, int], tuple[Any, int]] = {}
        #: Per thread, ``unsampled``: the job whose unsampled attempt it started
        #: last, whose context is current there until the attempt ends (kept
        #: out of ``_running``: no key to hash, no entry, per unsampled attempt).
        self._thread = threading.local()

    # -- enqueue -------------------------------------------------------------

    def enqueuing(self, sender: Any, params: Sequence[JobInsertParams]) -> Mapping[str, Any] | None:
        """Open the enqueue span; return its context to store with the jobs."""
        for stale in self._enqueues.get():  # an insert that raised: its span ends failed
            stale.set_status(Status(StatusCode.ERROR, "the insert failed"))
            stale.end()
        if not params:
            self._enqueues.set(())
            return None
        queues = {p.queue for p in params}
        kinds = {p.kind for p in params}
        queue = next(iter(queues)) if len(queues) == 1 else "(several)"
        kind = next(iter(kinds)) if len(kinds) == 1 else "(several)"
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue",
            "messaging.destination.name": queue,
            "hopper.job.kind": kind,
        }
        if len(params) > 1:
            attributes["messaging.batch.message_count"] = len(params)
        span = self.tracer.start_span(
            f"enqueue {kind}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        if not span.get_span_context().is_valid:  # the API's no-op tracer: no SDK
            self._enqueues.set(())
            return None
        # Stored even when the trace is not sampled: its flags carry the
        # decision to the attempts, so a parent-based sampler drops them too
        # instead of sampling each attempt as the root of a trace of its own.
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        self._enqueues.set((span,) if span.is_recording() else ())
        return {METADATA_KEY: carrier} if carrier else None

    def enqueued(self, sender: Any, jobs: Sequence[JobRow], duplicates: Sequence[JobRow]) -> None:
        """Close the enqueue span with the job's ID."""
        spans = self._enqueues.get()
        if not spans:
            return
        self._enqueues.set(())
        span = spans[-1]
        rows = [*jobs, *duplicates]
        if len(rows) == 1:
            span.set_attribute("messaging.message.id", str(rows[0].id))
            span.set_attribute("hopper.job.duplicate", bool(duplicates))
        elif duplicates:
            span.set_attribute("hopper.job.duplicates", len(duplicates))
        span.end()

    # -- attempts ------------------------------------------------------------

    def started(self, job: JobRow) -> None:
        """Open the attempt's span (from its claim), current in the attempt's thread."""
        metadata = job.metadata
        carrier = metadata.get(METADATA_KEY) if metadata and isinstance(metadata, dict) else None
        if carrier is None:
            # A job enqueued without a trace starts one (an explicit empty parent:
            # never whatever an earlier attempt left current in this thread).
            parent = _ROOT
        else:
            stored = _stored_parent(carrier) if isinstance(carrier, dict) else None
            if stored is not None:
                remote = trace.set_span_in_context(NonRecordingSpan(stored), _ROOT)
                if not stored.trace_flags.sampled and self._drops_unsampled():
                    # Unsampled, and the sampler would drop the attempt: make the
                    # stored context current as it is, without asking the SDK.
                    otel_context.attach(remote)
                    self._thread.unsampled = job
                    return
                parent = remote
            elif isinstance(carrier, dict):  # another propagator's fields, a tracestate, baggage
                parent = propagate.extract(carrier)
            else:
                parent = _ROOT
        name, attributes = self._described(job.queue, job.kind, job.attempt)
        now = time.time_ns()
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            start_time=_ns(job.attempted_at, now),
        )
        if not span.is_recording():
            # Not sampled (or no SDK): no span work at all. An unsampled
            # context is still made current, so that what the job traces
            # (queries, HTTP calls, jobs it enqueues) follows the decision.
            if span.get_span_context().is_valid:
                otel_context.attach(trace.set_span_in_context(span, parent))
                self._thread.unsampled = job
            return
        # The message ID is unique per job: set on a recorded span only, after
        # the sampler decided (no sampler decides by it), so that an unsampled
        # attempt never formats it.
        span.set_attribute("messaging.message.id", str(job.id))
        span.add_event("started", timestamp=now)
        # Made current by setting the context, not attach/detach with a token:
        # the attempt may end in another context than it started in (a sync
        # timeout ends it from the main thread; an async job's signals run in
        # copies of its task's context), where a token cannot be reset. The
        # next attempt of the thread, or the end of this one, replaces it.
        otel_context.attach(trace.set_span_in_context(span, parent))
        self._running[(job.id, job.fence)] = (span, threading.get_ident())

    def _described(self, queue: str, kind: str, attempt: int) -> tuple[str, Mapping[str, Any]]:
        """Return an attempt span's name and attributes, built once per (queue, kind, attempt).

        The SDK copies a recorded span's attributes and only reads a sampler's,
        so one mapping serves every attempt alike; the cache is bounded.
        """
        key = (queue, kind, attempt)
        described = self._descriptions.get(key)
        if described is None:
            if len(self._descriptions) >= 4096:
                self._descriptions.clear()
            described = self._descriptions[key] = (
                f"run {kind}",
                {
                    "messaging.system": SYSTEM,
                    "messaging.operation.type": "process",
                    "messaging.destination.name": queue,
                    "hopper.job.kind": kind,
                    "hopper.job.attempt": attempt,
                },
            )
        return described

    def _drops_unsampled(self) -> bool:
        """Return whether the provider's sampler drops every child of an unsampled remote parent.

        True for the SDK's ``ParentBased`` with its default for such a parent:
        the SDK would make a non-recording span, so none of its work is
        needed. Asked once per provider.
        """
        provider = self._provider or trace.get_tracer_provider()
        asked, drops = self._drops
        if asked is not provider:
            drops = _drops_unsampled_parents(provider)
            self._drops = (provider, drops)
        return drops

    def finished(
        self, job: JobRow, state: str, error: BaseException | str | None, duration: float | None
    ) -> None:
        """End the run span with the attempt's state; record a failure's exception."""
        thread = self._thread
        if getattr(thread, "unsampled", None) is job:
            # An unsampled attempt ending in the thread that ran it: nothing to
            # end, its context to leave. Ended elsewhere (a timeout, from the
            # worker's thread), the thread's next attempt replaces the context.
            thread.unsampled = None
            otel_context.attach(_ROOT)
            return
        entry = self._running.pop((job.id, job.fence), None)
        if entry is None:
            return
        span, ident = entry
        span.set_attribute("hopper.job.state", state)
        if error is not None and state not in ("scheduled", "canceled"):
            if isinstance(error, BaseException):
                span.record_exception(error)
                text = f"{type(error).__name__}: {error}"
            else:
                text = str(error)
            span.set_status(Status(StatusCode.ERROR, text))
        elif state == "canceled":
            span.add_event("canceled")
        span.end()
        if ident == threading.get_ident() and trace.get_current_span() is span:
            otel_context.attach(_ROOT)
