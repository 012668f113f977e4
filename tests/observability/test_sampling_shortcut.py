"""Hopper's own sampling decision: exactly the SDK's, or the SDK is asked.

For the samplers whose decision hopper reproduces (``ParentBased`` over
``TraceIdRatioBased`` and the static samplers, and those alone), a span the
sampler drops is made without the SDK: it must be the very span the SDK would
have returned (trace ID, span ID, flags, trace state), and a span it records
must be the SDK's own, with the trace ID drawn for the decision. Each case
runs the SDK and hopper from the same random seed and compares.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from django_hopper import api, observability
from django_hopper.observability import tracing
from django_hopper.observability.tracing import METADATA_KEY, TracingSink
from tests.testapp import jobs

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.sdk.trace.sampling import (  # noqa: E402
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState  # noqa: E402

SAMPLERS = {
    "parent-based ratio 0": lambda: ParentBased(TraceIdRatioBased(0.0)),
    "parent-based ratio 1": lambda: ParentBased(TraceIdRatioBased(1.0)),
    "parent-based ratio 0.5": lambda: ParentBased(TraceIdRatioBased(0.5)),
    "parent-based always off": lambda: ParentBased(ALWAYS_OFF),
    "parent-based always on": lambda: ParentBased(ALWAYS_ON),
    "parent-based, unsampled parents sampled by ratio": lambda: ParentBased(
        TraceIdRatioBased(0.3),
        remote_parent_not_sampled=TraceIdRatioBased(0.5),
        local_parent_not_sampled=ALWAYS_ON,
        local_parent_sampled=ALWAYS_OFF,
    ),
    "ratio 0.5": lambda: TraceIdRatioBased(0.5),
    "always off": lambda: ALWAYS_OFF,
    "always on": lambda: ALWAYS_ON,
}

STATE = TraceState([("vendor", "value")])
#: Parents: none, then remote and local ones, sampled or not, with the random
#: trace-ID flag or a trace state; the trace IDs' low 64 bits fall on either
#: side of a ratio of 0.5.
PARENTS: dict[str, Any] = {"none": None}
for remote in (True, False):
    for flags in (0, 1, 2, 3):
        for low in (0x10, 0xF000_0000_0000_0000):
            PARENTS[f"{'remote' if remote else 'local'} flags {flags} low {low:x}"] = SpanContext(
                trace_id=(0xAB << 64) | low,
                span_id=0x1234,
                is_remote=remote,
                trace_flags=TraceFlags(flags),
            )
PARENTS["remote unsampled with a trace state"] = SpanContext(
    trace_id=0xCD << 64 | 0x99,
    span_id=7,
    is_remote=True,
    trace_flags=TraceFlags(0),
    trace_state=STATE,
)


@pytest.fixture(autouse=True)
def _random_state() -> Any:
    """The tests seed the global random generator (the SDK's IDs): leave it as it was."""
    state = random.getstate()
    yield
    random.setstate(state)


def _context(parent: Any) -> Any:
    if parent is None:
        return otel_context.Context()
    return trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())


def _described(span: Any) -> tuple[Any, ...]:
    c = span.get_span_context()
    return (c.trace_id, c.span_id, c.is_remote, int(c.trace_flags), c.trace_state, c.is_valid)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("parent", PARENTS)
def test_decider__takes_exactly_the_sdks_decision_and_makes_its_span(sampler, parent):
    context = _context(PARENTS[parent])
    for seed in range(12):  # roots: several trace IDs, on both sides of a ratio
        random.seed(seed)
        reference = otel_sdk.TracerProvider(sampler=SAMPLERS[sampler]())
        expected = reference.get_tracer("reference").start_span("run x", context=context)

        provider = otel_sdk.TracerProvider(sampler=SAMPLERS[sampler]())
        decider = tracing._decider(provider)
        assert decider is not None
        random.seed(seed)
        dropped = decider.dropped(trace.get_current_span(context).get_span_context())
        if dropped is None:  # recorded: the SDK makes it, with the trace ID drawn to decide
            made = decider.tracer.start_span("run x", context=context)
            assert made.is_recording()
        else:
            made = dropped
            assert not made.is_recording()
        assert expected.is_recording() == made.is_recording()
        assert _described(made) == _described(expected)
        # The same random draws as the SDK's: what follows is unchanged.
        after_hopper = random.random()
        random.seed(seed)
        reference.get_tracer("reference").start_span("run x", context=context)
        assert random.random() == after_hopper
        if PARENTS[parent] is not None:
            break  # a child's decision does not depend on the draws


class Counting(Sampler):
    """A sampler hopper cannot reproduce: it counts the SDK's questions."""

    def __init__(self) -> None:
        self.asked = 0

    def should_sample(
        self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any
    ) -> Any:
        self.asked += 1
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "Counting"


class RatioByName(TraceIdRatioBased):
    """A subclass that decides otherwise than its base: not reproduced either."""

    def should_sample(
        self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any
    ) -> Any:
        return SamplingResult(Decision.RECORD_AND_SAMPLE if "keep" in name else Decision.DROP)


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: Counting(),
        lambda: ParentBased(Counting()),
        lambda: ParentBased(TraceIdRatioBased(0.1), remote_parent_not_sampled=Counting()),
        lambda: ParentBased(RatioByName(0.0)),
    ],
    ids=[
        "custom",
        "parent-based custom root",
        "parent-based custom delegate",
        "overriding subclass",
    ],
)
def test_decider__a_sampler_it_cannot_reproduce_is_left_to_the_sdk(sampler):
    assert tracing._decider(otel_sdk.TracerProvider(sampler=sampler())) is None


def test_decider__not_for_the_sdks_span_metrics_which_count_dropped_spans_too(monkeypatch):
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    provider = otel_sdk.TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
    assert tracing._decider(provider) is None


def test_decider__not_for_a_provider_that_is_not_the_sdks():
    assert tracing._decider(trace.NoOpTracerProvider()) is None


def _provider(sampler: Any) -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = otel_sdk.TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_tracing__a_custom_sampler_decides_every_attempt_through_the_sdk(tx_engine, make_worker):
    sampler = Counting()
    provider, exporter = _provider(ParentBased(sampler))
    sink = observability.add_sink(TracingSink(tracer_provider=provider))
    try:
        for _ in range(3):
            jobs.add.enqueue(1, 2)  # outside a trace: each enqueue span is a root
        assert make_worker(queues={"default": 3}).run_once() == 3
    finally:
        observability.remove_sink(sink)
    # Three enqueue roots; the attempts' stored parents are unsampled (dropped by
    # ParentBased's default without a question).
    assert sampler.asked == 3
    assert exporter.get_finished_spans() == ()


def test_tracing__jobs_without_a_trace_are_sampled_by_their_trace_id(tx_engine, make_worker):
    provider, exporter = _provider(ParentBased(TraceIdRatioBased(0.5)))
    sink = observability.add_sink(TracingSink(tracer_provider=provider))
    observability.remove_sink(sink)  # enqueue untraced, as SQL or a process without tracing would
    ids = [str(jobs.obs_current_span.enqueue().id) for _ in range(40)]
    assert all(METADATA_KEY not in (api.get_job(i).metadata or {}) for i in ids)
    observability.add_sink(sink)
    try:
        worker = make_worker(queues={"default": 10})
        done = 0
        while done < len(ids):
            ran = worker.run_once()
            assert ran
            done += ran
    finally:
        observability.remove_sink(sink)
    recorded = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}
    bound = TraceIdRatioBased(0.5).bound
    for job_id in ids:
        output = api.get_job(job_id).output
        span_id = int(output, 16)
        assert span_id != 0  # a span is current in every attempt, recorded or not
        if job_id in recorded:
            span = recorded[job_id]
            assert span.context.span_id == span_id
            assert span.context.trace_id & (2**64 - 1) < bound
    # 40 roots at 0.5: all recorded or none would be a broken decision.
    assert 0 < len(recorded) < len(ids)


def test_make_current__sets_the_apis_context_variable_as_attach_does():
    context = otel_context.Context({"hopper-test": 1})
    make_current = tracing._make_current()
    token = otel_context.attach(tracing._ROOT)
    try:
        make_current(context)
        assert otel_context.get_current() is context
    finally:
        otel_context.detach(token)


def test_make_current__leaves_another_runtime_context_to_attach(monkeypatch: pytest.MonkeyPatch):
    class Elsewhere(otel_context.context._RuntimeContext):  # type: ignore[misc]
        def attach(self, context: Any) -> Any:
            return None

        def get_current(self) -> Any:
            return tracing._ROOT

        def detach(self, token: Any) -> None:
            pass

    monkeypatch.setattr(otel_context, "_RUNTIME_CONTEXT", Elsewhere())
    assert tracing._make_current() is otel_context.attach


def _untraced(sink: TracingSink, job: Any, *args: Any) -> str:
    """Enqueue ``job`` outside any trace (as SQL or an untraced process would); return its ID."""
    observability.remove_sink(sink)
    try:
        return str(job.enqueue(*args).id)
    finally:
        observability.add_sink(sink)


def _traceparent(job_id: str) -> tuple[int, int, int]:
    """Return the stored context of a job: (trace ID, parent span ID, flags)."""
    _, trace_id, span_id, flags = (
        api.get_job(job_id).metadata[METADATA_KEY]["traceparent"].split("-")
    )
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


def test_tracing__an_unsampled_root_attempt_passes_its_trace_id_to_the_jobs_it_enqueues(
    tx_engine, make_worker
):
    provider, exporter = _provider(ParentBased(TraceIdRatioBased(0.0)))  # every root dropped
    sink = observability.add_sink(TracingSink(tracer_provider=provider))
    try:
        parent_id = _untraced(sink, jobs.obs_trace_and_child, 1, 2)
        worker = make_worker(queues={"default": 1})
        assert worker.run_once() == 1
        trace_hex, sampled, child_id = api.get_job(parent_id).output.split("-", 2)
        assert worker.run_once() == 1
    finally:
        observability.remove_sink(sink)
    # The dropped root was current in the attempt: a valid trace, not sampled,
    # and the child's stored context carries that trace and that decision.
    trace_id = int(trace_hex, 16)
    assert trace_id != 0 and sampled == "0"
    stored_trace, stored_span, flags = _traceparent(child_id)
    assert stored_trace == trace_id and stored_span != 0
    assert flags & 1 == 0
    assert api.get_job(child_id).output == 3
    assert exporter.get_finished_spans() == ()


def test_tracing__a_sampled_root_attempt_is_exported_in_the_trace_its_child_job_links_to(
    tx_engine, make_worker
):
    provider, exporter = _provider(ParentBased(TraceIdRatioBased(1.0)))  # every root recorded
    sink = observability.add_sink(TracingSink(tracer_provider=provider))
    try:
        parent_id = _untraced(sink, jobs.obs_trace_and_child, 1, 2)
        worker = make_worker(queues={"default": 1})
        assert worker.run_once() == 1
        trace_hex, sampled, child_id = api.get_job(parent_id).output.split("-", 2)
        assert worker.run_once() == 1
    finally:
        observability.remove_sink(sink)
    finished = exporter.get_finished_spans()
    runs = {s.attributes["messaging.message.id"]: s for s in finished if s.name.startswith("run ")}
    (enqueue,) = (s for s in finished if s.name.startswith("enqueue "))
    root, child_run = runs[parent_id], runs[child_id]
    # The root's span is the SDK's, with the trace ID hopper drew to decide,
    # its attributes as any run span's; the child links to it through the database.
    assert root.parent is None and sampled == "1"
    assert root.context.trace_id == int(trace_hex, 16)
    assert dict(root.attributes) == {
        "messaging.system": "django_hopper",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "hopper.job.kind": jobs.obs_trace_and_child.kind,
        "hopper.job.attempt": 1,
        "messaging.message.id": parent_id,
        "hopper.job.state": "completed",
    }
    assert [e.name for e in root.events] == ["started"]
    assert enqueue.parent.span_id == root.context.span_id
    stored_trace, stored_span, flags = _traceparent(child_id)
    assert (stored_trace, stored_span) == (root.context.trace_id, enqueue.context.span_id)
    assert flags & 1 == 1
    assert child_run.parent.span_id == enqueue.context.span_id
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}


@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
def test_tracing__a_root_attempt_is_the_span_the_sdk_would_start(ratio: float):
    from bench.hooks import _jobs

    sampler = ParentBased(TraceIdRatioBased(ratio))
    provider, exporter = _provider(sampler)
    sink = TracingSink(tracer_provider=provider)
    attempts = _jobs(40, [None])
    random.seed(11)
    seen = []
    for job in attempts:
        sink.started(job)
        span = trace.get_current_span()
        seen.append((*_described(span), span.is_recording()))
        sink.finished(job, "completed", None, 0.001)
        assert trace.get_current_span().get_span_context().is_valid is False
    # The SDK alone, from the same seed: the same IDs, flags and decisions.
    tracer = otel_sdk.TracerProvider(sampler=sampler).get_tracer("sdk")
    random.seed(11)
    expected = []
    for _ in attempts:
        span = tracer.start_span("run", context=otel_context.Context())
        expected.append((*_described(span), span.is_recording()))
        span.end()
    assert seen == expected
    assert len(exporter.get_finished_spans()) == sum(recorded for *_, recorded in seen)
