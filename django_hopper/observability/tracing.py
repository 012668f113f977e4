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
import random
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
    #: The flags of a span that is not sampled: none, or with W3C's
    #: random-trace-ID flag when the trace ID is random (as the SDK sets them).
    _DEFAULT_FLAGS = TraceFlags(TraceFlags.DEFAULT)
    _RANDOM_FLAGS = TraceFlags(TraceFlags.DEFAULT | getattr(TraceFlags, "RANDOM_TRACE_ID", 0))
    #: The trace state of a span context made without one.
    _NO_STATE = SpanContext(1, 1, is_remote=False).trace_state
    #: The key a context holds its current span under (the API's own, asked once).
    _SPAN_KEY = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, _ROOT)))
except ImportError:  # pragma: no cover - the extra is not installed
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django_hopper.engine.params import JobInsertParams
    from django_hopper.types import JobRow

_new_tuple = tuple.__new__


def _make_current() -> Any:
    """Return what makes a context current: ``otel_context.attach``, or what it calls.

    With the API's default runtime context (a ``ContextVar``), its variable's
    own ``set``: the two Python calls in between cost each attempt twice (its
    context made current, then the root's). Any other runtime context is
    left to ``attach``.
    """
    try:
        from opentelemetry.context import _RUNTIME_CONTEXT  # noqa: PLC0415 - optional dependency
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext  # noqa: PLC0415
    except ImportError:  # pragma: no cover - an API without them
        return otel_context.attach
    variable = getattr(_RUNTIME_CONTEXT, "_current_context", None)
    if type(_RUNTIME_CONTEXT) is ContextVarsRuntimeContext and callable(
        getattr(variable, "set", None)
    ):
        return variable.set  # type: ignore[union-attr]
    return otel_context.attach


def _current_in(span: Any, parent: Any) -> Any:
    """Return ``parent`` with ``span`` current, as ``trace.set_span_in_context`` does.

    Under the empty root context (a trace's first span), the context is made
    in one step: the API's copy of an empty context costs an attempt more.
    """
    if parent is _ROOT:
        return otel_context.Context({_SPAN_KEY: span})
    return trace.set_span_in_context(span, parent)


#: The metadata key the enqueue span's context is stored under.
METADATA_KEY = "otel"
SYSTEM = "django_hopper"
#: ``TraceIdRatioBased`` decides by the trace ID's low 64 bits.
_TRACE_ID_LIMIT = (1 << 64) - 1


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


#: The SDK's default ID generator class (set when a decider is first built).
_RandomIdGenerator: Any = None

#: Per thread, a trace ID drawn by hopper for a root span the SDK is about to
#: start (its sampler decided to record it): see :class:`_PrimedIds`.
_primed = threading.local()


class _PrimedIds:
    """An ID generator that hands out a trace ID hopper drew before the SDK starts a root.

    Hopper draws a root's trace ID from the provider's generator to decide the
    sampling itself; when the span is to be recorded, the SDK must make it
    with that same ID (the decision depends on it), so the drawn ID is left
    here for the SDK's next ``generate_trace_id`` in the same thread. Every
    other call goes to the provider's generator: the random draws are the
    SDK's own, in the same order.
    """

    def __init__(self, generator: Any) -> None:
        self.generator = generator

    def generate_trace_id(self) -> int:
        drawn = _primed.__dict__.pop("trace_id", None)
        return self.generator.generate_trace_id() if drawn is None else drawn

    def generate_span_id(self) -> int:
        return self.generator.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return bool(self.generator.is_trace_id_random())


def _drop_rule(sampler: Any) -> Any:
    """Return how ``sampler`` decides, when hopper can reproduce it exactly, else None.

    ``True``/``False``: it always drops / never drops (the SDK's static
    samplers, ``ALWAYS_OFF`` and ``ALWAYS_ON``); an int: ``TraceIdRatioBased``'s
    bound (it drops a trace whose low 64 bits are not below it). Any other
    sampler, a subclass that overrides the decision included, is not
    reproduced.
    """
    from opentelemetry.sdk.trace import sampling  # noqa: PLC0415 - optional: the SDK may be absent

    kind = type(sampler)
    if kind.should_sample is sampling.StaticSampler.should_sample:
        decision = sampler.should_sample(None, 1, "probe").decision  # ignores its arguments
        return not decision.is_recording()
    if kind is sampling.TraceIdRatioBased and kind.TRACE_ID_LIMIT == _TRACE_ID_LIMIT:
        return int(sampler.bound)
    return None


class _Decider:
    """Take the SDK's sampling decision before the SDK, and make a dropped span without it.

    Built for an SDK ``TracerProvider`` whose sampler is ``ParentBased``,
    ``TraceIdRatioBased`` or a static sampler (``ALWAYS_OFF``, ``ALWAYS_ON``),
    over the SDK's own classes (``ParentBased``'s delegates likewise), with
    the SDK's internal span metrics off (they count dropped spans too). For
    a span the sampler drops, :meth:`dropped` returns the non-recording span
    the SDK would return (same trace ID, a span ID from the provider's
    generator, the same flags and trace state), without the SDK's span
    machinery; for one it records, None (the caller asks the SDK, which
    decides the same). :func:`_decider` returns None for anything else, and
    hopper asks the SDK every time.
    """

    def __init__(
        self, tracer: Any, ids: Any, root: Any, parents: tuple[Any, Any, Any, Any]
    ) -> None:
        self.tracer = tracer
        #: The provider's ID generator (not the tracer's priming wrapper: a
        #: dropped span's IDs are drawn from it directly).
        self.ids = ids
        #: The SDK's default generator is drawn from inline, as it draws.
        self.random_ids = type(ids) is _RandomIdGenerator
        #: The rule of a root span, then of a span whose parent is (remote,
        #: sampled), (remote, unsampled), (local, sampled), (local, unsampled).
        self.root = root
        self.parents = parents

    def dropped(self, parent: Any) -> Any:
        """Return the span the SDK would drop under ``parent`` (a span context or None), else None.

        A root whose sampler records it leaves its trace ID drawn for the
        SDK's next start in this thread (:class:`_PrimedIds`).
        """
        if not self.tracer._is_enabled():  # a tracer configurator turned it off: the SDK's own span
            return None
        random_ids = self.random_ids
        if parent is None or not parent.is_valid:
            if random_ids:  # RandomIdGenerator.generate_trace_id
                trace_id = random.getrandbits(128)
                while not trace_id:
                    trace_id = random.getrandbits(128)
            else:
                trace_id = self.ids.generate_trace_id()
            rule = self.root
            drops = rule if rule.__class__ is bool else trace_id & _TRACE_ID_LIMIT >= rule
            if not drops:
                _primed.trace_id = trace_id
                return None
            flags = _RANDOM_FLAGS if random_ids or self.ids.is_trace_id_random() else _DEFAULT_FLAGS
            state = None
        else:
            trace_id = parent.trace_id
            flags_in = parent.trace_flags
            rule = self.parents[(0 if parent.is_remote else 2) + (0 if flags_in.sampled else 1)]
            drops = rule if rule.__class__ is bool else trace_id & _TRACE_ID_LIMIT >= rule
            if not drops:
                return None
            flags = _RANDOM_FLAGS if flags_in.random_trace_id else _DEFAULT_FLAGS
            state = parent.trace_state
        if random_ids:  # RandomIdGenerator.generate_span_id
            span_id = random.getrandbits(64)
            while not span_id:
                span_id = random.getrandbits(64)
            # Both IDs are nonzero and in range: the context is valid, made
            # as SpanContext makes it without its checks (a Python __new__).
            return NonRecordingSpan(
                _new_tuple(
                    SpanContext,
                    (trace_id, span_id, False, flags, state or _NO_STATE, True),
                )
            )
        return NonRecordingSpan(
            SpanContext(
                trace_id,
                self.ids.generate_span_id(),
                is_remote=False,
                trace_flags=flags,
                trace_state=state,
            )
        )


def _decider(provider: Any) -> _Decider | None:
    """Return a :class:`_Decider` for ``provider``, or None when its decision is not reproduced."""
    try:
        from opentelemetry.sdk import trace as sdk_trace  # noqa: PLC0415 - optional: the SDK may be absent
        from opentelemetry.sdk.trace import _tracer_metrics, sampling  # noqa: PLC0415
    except ImportError:
        return None
    global _RandomIdGenerator
    _RandomIdGenerator = sdk_trace.RandomIdGenerator
    if not isinstance(provider, sdk_trace.TracerProvider):
        return None
    if not hasattr(TraceFlags, "RANDOM_TRACE_ID"):  # an API older than the SDK's flags
        return None
    tracer = provider.get_tracer("django_hopper", __version__)
    if type(tracer) is not sdk_trace.Tracer:
        return None  # disabled (the API's no-op tracer), or a tracer of the provider's own
    if not isinstance(getattr(tracer, "_tracer_metrics", None), _tracer_metrics.NoOpTracerMetrics):
        return None  # the SDK counts started spans, dropped ones included
    if not callable(getattr(tracer, "_is_enabled", None)):
        return None
    sampler: Any = tracer.sampler
    if type(sampler).should_sample is sampling.ParentBased.should_sample:
        root = _drop_rule(sampler._root)
        parents = tuple(
            _drop_rule(s)
            for s in (
                sampler._remote_parent_sampled,
                sampler._remote_parent_not_sampled,
                sampler._local_parent_sampled,
                sampler._local_parent_not_sampled,
            )
        )
    else:
        root = _drop_rule(sampler)
        parents = (root, root, root, root)
    if root is None or None in parents:
        return None
    primed: Any = tracer.id_generator
    if not isinstance(primed, _PrimedIds):
        # The tracer is the provider's, kept per instrumentation scope: only
        # hopper starts spans with it, and the wrapper is transparent to them.
        primed = _PrimedIds(primed)
        tracer.id_generator = primed
    return _Decider(tracer, primed.generator, root, parents)  # type: ignore[arg-type]


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
        #: Makes a context current (for the per-attempt unsampled paths).
        self._attach = _make_current()
        #: (the provider asked, whether its sampler drops every child of an
        #: unsampled remote parent): asked once per provider.
        self._drops: tuple[Any, bool] = (None, False)
        #: (the provider asked, its :class:`_Decider` or None): built once per provider.
        self._deciders: tuple[Any, _Decider | None] = (None, None)
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
        decider = self._decider()
        # A span the sampler drops is made without the SDK, before any of
        # its name and attributes are built (no sampler here decides by them).
        current = trace.get_current_span().get_span_context()
        span = None if decider is None else decider.dropped(current)
        if span is None:  # the SDK's decision (the same one), its span
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
            tracer = self.tracer if decider is None else decider.tracer
            span = tracer.start_span(
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
        parent_span = None
        if carrier is None:
            # A job enqueued without a trace starts one (an explicit empty parent:
            # never whatever an earlier attempt left current in this thread).
            provider = self._provider or trace.get_tracer_provider()
            asked, decider = self._deciders
            if asked is not provider:
                decider = self._decider()
            if decider is not None and decider.random_ids and decider.tracer._is_enabled():
                # The root's decision as _Decider.dropped takes it, inline: the
                # trace ID drawn as the SDK's RandomIdGenerator draws it, and
                # for a dropped root its non-recording span current, made in
                # one step (no call of the decider's, no context copied).
                trace_id = random.getrandbits(128)
                while not trace_id:
                    trace_id = random.getrandbits(128)
                rule = decider.root
                if rule is True or (rule is not False and trace_id & _TRACE_ID_LIMIT >= rule):
                    span_id = random.getrandbits(64)
                    while not span_id:
                        span_id = random.getrandbits(64)
                    context = _new_tuple(
                        SpanContext, (trace_id, span_id, False, _RANDOM_FLAGS, _NO_STATE, True)
                    )
                    self._attach(otel_context.Context({_SPAN_KEY: NonRecordingSpan(context)}))
                    self._thread.unsampled = job
                    return
                _primed.trace_id = trace_id  # recorded: the SDK's start takes this trace ID
                self._start(decider.tracer, job, _ROOT, recorded=True)
                return
            parent = _ROOT
        else:
            stored = _stored_parent(carrier) if isinstance(carrier, dict) else None
            if stored is not None:
                remote = trace.set_span_in_context(NonRecordingSpan(stored), _ROOT)
                if not stored.trace_flags.sampled and self._drops_unsampled():
                    # Unsampled, and the sampler would drop the attempt: make the
                    # stored context current as it is, without asking the SDK.
                    self._attach(remote)
                    self._thread.unsampled = job
                    return
                parent, parent_span = remote, stored
            elif isinstance(carrier, dict):  # another propagator's fields, a tracestate, baggage
                parent = propagate.extract(carrier)
                parent_span = trace.get_current_span(parent).get_span_context()
            else:
                parent = _ROOT
        decider = self._decider()
        tracer = self.tracer
        if decider is not None:
            dropped = decider.dropped(parent_span)
            if dropped is not None:
                # The sampler drops the attempt, decided as the SDK decides:
                # its non-recording span is current, no span object of the SDK.
                self._attach(_current_in(dropped, parent))
                self._thread.unsampled = job
                return
            tracer = decider.tracer  # the one that starts a root with the ID drawn to decide
        self._start(tracer, job, parent)

    def _start(self, tracer: Any, job: JobRow, parent: Any, *, recorded: bool = False) -> None:
        """Start the attempt's span with the SDK under ``parent``, current in this thread.

        ``recorded``: the sampler's decision is known to record it (taken
        ahead by hopper), so the message ID goes with the start's attributes.
        """
        name, attributes = self._described(job.queue, job.kind, job.attempt)
        if recorded:
            attributes = {**attributes, "messaging.message.id": str(job.id)}
        now = time.time_ns()
        span = tracer.start_span(
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
        if not recorded:
            # The message ID is unique per job: set on a recorded span only,
            # after the sampler decided (no sampler decides by it), so that an
            # unsampled attempt never formats it.
            span.set_attribute("messaging.message.id", str(job.id))
        span.add_event("started", timestamp=now)
        # Made current by setting the context, not attach/detach with a token:
        # the attempt may end in another context than it started in (a sync
        # timeout ends it from the main thread; an async job's signals run in
        # copies of its task's context), where a token cannot be reset. The
        # next attempt of the thread, or the end of this one, replaces it.
        self._attach(_current_in(span, parent))
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

    def _decider(self) -> _Decider | None:
        """Return the provider's :class:`_Decider`, or None: built once per provider."""
        provider = self._provider or trace.get_tracer_provider()
        asked, decider = self._deciders
        if asked is not provider:
            decider = _decider(provider)
            self._deciders = (provider, decider)
        return decider

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
            self._attach(_ROOT)
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
            self._attach(_ROOT)
