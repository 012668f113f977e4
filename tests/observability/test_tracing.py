"""OpenTelemetry: one trace from a Django view through enqueue, claim and run, and a retry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_hopper import api, observability
from django_hopper.observability.tracing import METADATA_KEY, TracingSink
from tests.testapp import jobs

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

PROVIDER = otel_sdk.TracerProvider()
EXPORTER = InMemorySpanExporter()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


def enqueue_view(request: HttpRequest) -> JsonResponse:
    """A view as Django instrumentation would trace it: a SERVER span around the request."""
    tracer = PROVIDER.get_tracer("tests")
    with tracer.start_as_current_span("GET /enqueue/", kind=SpanKind.SERVER):
        handle = jobs.rt_flaky.enqueue(failures=1)
    return JsonResponse({"id": str(handle.id)})


urlpatterns = [path("enqueue/", enqueue_view)]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Trace into an in-memory exporter for the test."""
    sink = observability.add_sink(TracingSink(tracer_provider=PROVIDER))
    EXPORTER.clear()
    yield EXPORTER
    observability.remove_sink(sink)


def by_name(finished: Any, prefix: str) -> list[Any]:
    return sorted(
        (s for s in finished if s.name.startswith(prefix)),
        key=lambda s: s.attributes.get("hopper.job.attempt", 0),
    )


@override_settings(ROOT_URLCONF=__name__)
def test_tracing__one_trace_links_a_view_to_each_attempt_of_its_job(tx_engine, make_worker, spans):
    response = Client().get("/enqueue/")
    job_id = response.json()["id"]
    stored = api.get_job(job_id)
    assert stored.metadata[METADATA_KEY]["traceparent"]

    worker = make_worker(queues={"default": 2})
    assert worker.run_once() == 1  # attempt 1 fails and is retried later
    api.retry_job(job_id)  # make the retry due now
    assert worker.run_once() == 1  # attempt 2 completes
    assert api.get_job(job_id).state == "completed"

    finished = spans.get_finished_spans()
    (view,) = by_name(finished, "GET /enqueue/")
    (enqueue,) = by_name(finished, "enqueue ")
    runs = by_name(finished, "run ")
    assert len(runs) == 2
    assert {s.context.trace_id for s in finished} == {view.context.trace_id}

    assert enqueue.parent.span_id == view.context.span_id
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.attributes["messaging.message.id"] == job_id
    assert enqueue.attributes["messaging.destination.name"] == "default"
    assert enqueue.attributes["messaging.system"] == "django_hopper"
    assert enqueue.attributes["hopper.job.kind"] == "tests.testapp.jobs.rt_flaky"
    for attempt, run in enumerate(runs, start=1):
        assert run.parent.span_id == enqueue.context.span_id
        assert run.kind == SpanKind.CONSUMER
        assert run.attributes["hopper.job.attempt"] == attempt
        assert run.attributes["messaging.message.id"] == job_id
        assert run.attributes["messaging.operation.type"] == "process"
        # The span runs from the claim; the function's start is an event in it.
        (started,) = (e for e in run.events if e.name == "started")
        assert run.start_time <= started.timestamp <= run.end_time

    failed, completed = runs
    assert failed.status.status_code == StatusCode.ERROR
    assert "ValueError: flaky failure 1" in (failed.status.description or "")
    assert [e.name for e in failed.events] == ["started", "exception"]
    assert failed.attributes["hopper.job.state"] == "retryable"
    assert completed.status.status_code != StatusCode.ERROR
    assert completed.attributes["hopper.job.state"] == "completed"


def test_tracing__a_job_enqueued_by_a_job_continues_its_trace(tx_engine, make_worker, spans):
    tracer = PROVIDER.get_tracer("tests")
    with tracer.start_as_current_span("request"):
        parent_id = str(jobs.obs_enqueue_child.enqueue(1, 2).id)
    worker = make_worker(queues={"default": 1})
    assert worker.run_once() == 1
    child_id = api.get_job(parent_id).output
    assert worker.run_once() == 1
    assert api.get_job(child_id).output == 3

    finished = spans.get_finished_spans()
    (request,) = by_name(finished, "request")
    parent_run, child_run = (
        next(s for s in by_name(finished, "run ") if s.attributes["messaging.message.id"] == i)
        for i in (parent_id, child_id)
    )
    child_enqueue = next(
        s
        for s in by_name(finished, "enqueue ")
        if s.attributes.get("messaging.message.id") == child_id
    )
    assert child_enqueue.parent.span_id == parent_run.context.span_id
    assert child_run.parent.span_id == child_enqueue.context.span_id
    assert {s.context.trace_id for s in finished} == {request.context.trace_id}


def test_tracing__each_step_of_a_workflow_runs_in_the_trace_that_enqueued_it(
    tx_engine, make_worker, spans
):
    from django_hopper import Workflow

    tracer = PROVIDER.get_tracer("tests")
    wf = Workflow("traced")
    fetch = wf.add(jobs.wf_step, "fetch", step="fetch")
    wf.add(jobs.wf_step, "parse", after=[fetch], reads=["fetch"], step="parse")
    with tracer.start_as_current_span("request"):
        wf.enqueue()
    worker = make_worker(queues={"default": 2})
    assert worker.run_once() == 1  # fetch; parse waits for it
    assert worker.run_once() == 1  # parse

    finished = spans.get_finished_spans()
    (request,) = by_name(finished, "request")
    (enqueue,) = by_name(finished, "enqueue ")
    runs = by_name(finished, "run ")
    assert len(runs) == 2
    assert enqueue.attributes["messaging.batch.message_count"] == 2
    assert all(r.parent.span_id == enqueue.context.span_id for r in runs)
    assert {s.context.trace_id for s in finished} == {request.context.trace_id}


@pytest.mark.parametrize("fn", [jobs.obs_current_span, jobs.obs_current_span_async])
def test_tracing__the_run_span_is_current_while_the_job_runs(tx_engine, make_worker, spans, fn):
    ids = [str(fn.enqueue().id) for _ in range(3)]
    worker = make_worker(queues={"default": 3})
    assert worker.run_once() == 3
    runs = {
        s.attributes["messaging.message.id"]: s for s in by_name(spans.get_finished_spans(), "run ")
    }
    for job_id in ids:
        assert api.get_job(job_id).output == format(runs[job_id].context.span_id, "016x")


def test_tracing__without_a_recording_provider_nothing_is_stored(tx_engine):
    # The default sink uses the global provider, a no-op in this test process.
    handle = jobs.add.enqueue(1, 2)
    assert METADATA_KEY not in (api.get_job(handle.id).metadata or {})


def sampled_provider(root: Any) -> tuple[Any, InMemorySpanExporter]:
    """A provider sampling parent-based, new traces by ``root``, into its own exporter."""
    from opentelemetry.sdk.trace.sampling import ParentBased

    exporter = InMemorySpanExporter()
    provider = otel_sdk.TracerProvider(sampler=ParentBased(root))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_tracing__an_unsampled_trace_carries_its_decision_and_records_no_attempt(
    tx_engine, make_worker
):
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider, exporter = sampled_provider(ALWAYS_OFF)
    sink = observability.add_sink(TracingSink(tracer_provider=provider))
    try:
        job_id = str(jobs.obs_current_span.enqueue().id)
        traceparent = api.get_job(job_id).metadata[METADATA_KEY]["traceparent"]
        # Stored with the sampled flag off: the attempt inherits the decision.
        assert int(traceparent.split("-")[3], 16) & 1 == 0

        assert make_worker(queues={"default": 1}).run_once() == 1
    finally:
        observability.remove_sink(sink)

    assert exporter.get_finished_spans() == ()
    # The unsampled context is current in the job, so what it traces is dropped too.
    assert api.get_job(job_id).output == traceparent.split("-")[2]


def test_tracing__parent_based_ratio_sampling_follows_a_sampled_request(tx_engine, make_worker):
    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    provider, exporter = sampled_provider(TraceIdRatioBased(0.0))  # no new trace is sampled
    sink = observability.add_sink(TracingSink(tracer_provider=provider))
    upstream = SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=TraceFlags(1)
    )
    try:
        with trace.use_span(NonRecordingSpan(upstream)):
            sampled = str(jobs.add.enqueue(1, 2).id)
        unsampled = str(jobs.add.enqueue(3, 4).id)
        assert make_worker(queues={"default": 2}).run_once() == 2
    finally:
        observability.remove_sink(sink)

    finished = exporter.get_finished_spans()
    assert {s.attributes.get("messaging.message.id") for s in by_name(finished, "run ")} == {
        sampled
    }
    assert {s.context.trace_id for s in finished} == {0x1234}
    assert METADATA_KEY in api.get_job(unsampled).metadata
