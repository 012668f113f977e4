"""A task enqueued through the Django Tasks backend is traced as ``.enqueue()`` is."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_hopper import observability, signals
from django_hopper.observability.tracing import METADATA_KEY, TracingSink
from tests.tasks_backend import tasks

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind  # noqa: E402

PROVIDER = otel_sdk.TracerProvider()
EXPORTER = InMemorySpanExporter()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Trace into an in-memory exporter for the test."""
    sink = observability.add_sink(TracingSink(tracer_provider=PROVIDER))
    EXPORTER.clear()
    yield EXPORTER
    observability.remove_sink(sink)


def test_task_enqueue__one_trace_links_the_request_to_the_tasks_run(
    tx_engine: Any, run_worker: Callable[..., int], spans: InMemorySpanExporter
) -> None:
    with PROVIDER.get_tracer("tests").start_as_current_span("POST /orders", kind=SpanKind.SERVER):
        result = tasks.add.enqueue(2, 3)
    assert tx_engine.job_get(uuid.UUID(result.id)).metadata[METADATA_KEY]["traceparent"]

    assert run_worker() == 1

    finished = spans.get_finished_spans()
    (request,) = (s for s in finished if s.name == "POST /orders")
    (enqueue,) = (s for s in finished if s.name.startswith("enqueue "))
    (run,) = (s for s in finished if s.name.startswith("run "))
    assert {s.context.trace_id for s in finished} == {request.context.trace_id}
    assert enqueue.parent.span_id == request.context.span_id
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.attributes["messaging.message.id"] == result.id
    assert enqueue.attributes["hopper.job.kind"] == tasks.add.module_path
    assert run.parent.span_id == enqueue.context.span_id
    assert run.attributes["hopper.job.state"] == "completed"


def test_task_enqueue__sends_job_enqueuing_and_stores_what_receivers_return(
    engine: Any,
) -> None:
    seen: list[Any] = []

    def receiver(sender: Any, params: list[Any], **kwargs: Any) -> dict[str, Any]:
        seen.append((sender, [p.kind for p in params]))
        return {"request_id": "r-1"}

    signals.job_enqueuing.connect(receiver)
    try:
        result = tasks.add.enqueue(1, 1)
    finally:
        signals.job_enqueuing.disconnect(receiver)

    assert [kinds for _, kinds in seen] == [[tasks.add.module_path]]
    assert seen[0][0] is not None  # the job function the task's kind resolves to
    assert engine.job_get(uuid.UUID(result.id)).metadata["request_id"] == "r-1"
