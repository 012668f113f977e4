"""Turn on OpenTelemetry tracing and metrics in a benchmark worker (``BENCH_OBSERVE=1``).

A production-like SDK set-up whose exports go nowhere: spans through a
``BatchSpanProcessor`` (the processor production uses) to an exporter that
drops them, metrics aggregated by the SDK for a reader that is never read,
Prometheus counters on the client's registry. What it measures is what
hopper's hooks cost each job, not what an exporter's network costs.

``BENCH_OBSERVE_RATIO`` (default 1: every trace) samples that share of new
traces, parent-based, as docs/observability.md recommends for busy queues.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased


class DropExporter(SpanExporter):
    """Accept spans and drop them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Drop a batch."""
        return SpanExportResult.SUCCESS


_ratio = float(os.environ.get("BENCH_OBSERVE_RATIO", "1"))
_tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(_ratio)))
_tracer_provider.add_span_processor(BatchSpanProcessor(DropExporter()))
trace.set_tracer_provider(_tracer_provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
