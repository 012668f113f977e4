"""Time what tracing and metrics cost one job, in microseconds, without a database.

Sends ``job_enqueuing``/``job_enqueued`` and ``job_started``/``job_finished`` for
fake jobs exactly as the worker does, under each observability set-up, and
reports the mean cost per job over ``--jobs`` (best of ``--rounds``). CPU time
per job is independent of the machine's load far more than a throughput
ratio is, so this is the figure to compare changes by; ``--calls`` adds the
Python function calls per job, which no load moves; ``--callgrind N`` runs
only the target's set-up, for machine instructions per attempt:

    python -m bench.hooks --jobs 5000 --calls
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python -m bench.hooks --callgrind 3000     # and --callgrind 0; difference / 3000
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def _jobs(n: int, carriers: list[dict[str, Any] | None]) -> list[Any]:
    from django_hopper.types import JobRow

    now = dt.datetime.now(dt.UTC)
    out = []
    for i in range(n):
        carrier = carriers[i % len(carriers)]
        out.append(
            JobRow(
                id=uuid.uuid4(),
                kind="bench.jobs.noop",
                queue="bench",
                state="running",
                priority=1,
                attempt=1,
                max_attempts=25,
                scheduled_at=now,
                created_at=now,
                attempted_at=now,
                fence=1,
                metadata={"otel": carrier} if carrier else {},
            )
        )
    return out


def _cycle(jobs: list[Any]) -> float:
    """Run the worker's per-attempt signals for every job; return µs per job."""
    from django_hopper import signals

    start = time.process_time()
    for job in jobs:
        if signals.job_started.receivers:
            signals.send_positional(signals.job_started, None, job)
        if signals.job_finished.receivers:
            signals.send_positional(signals.job_finished, None, job, "completed", None, None)
    return (time.process_time() - start) / len(jobs) * 1e6


def _calls(jobs: list[Any]) -> float:
    """Return the Python function calls per job of the per-attempt signals (cProfile)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.runcall(_cycle, jobs)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    # Less the calls of _cycle itself and its two clock reads.
    return (sum(entry[1] for entry in stats.values()) - 3) / len(jobs)


def main() -> None:
    """Print µs per job for each set-up."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ratio", type=float, default=0.1, help="the sampled set-up's ratio")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="Also count Python function calls per job (cProfile): a figure load cannot move.",
    )
    parser.add_argument(
        "--callgrind",
        type=int,
        default=None,
        metavar="N",
        help="Only run N attempts of the target's set-up (parent-based 0.1 + Prometheus, jobs "
        "without a trace; the SDK's random IDs seeded), for valgrind --tool=callgrind: "
        "(instructions with N - with 0) / N is instructions per attempt.",
    )
    options = parser.parse_args()

    import django

    django.setup()
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from bench.observe import DropExporter
    from django_hopper import observability
    from django_hopper.engine.params import JobInsertParams
    from django_hopper.observability import metrics, tracing

    for sink in observability.sinks():  # measure only the set-ups below
        observability.remove_sink(sink)

    def provider(sampler: Any = None) -> Any:
        p = TracerProvider(sampler=sampler) if sampler else TracerProvider()
        p.add_span_processor(BatchSpanProcessor(DropExporter()))
        return p

    full, sampled = provider(), provider(ParentBased(TraceIdRatioBased(options.ratio)))
    if options.callgrind is not None:
        import random

        random.seed(7)  # the SDK's trace IDs, hence which attempts are sampled
        observability.add_sink(tracing.TracingSink(tracer_provider=sampled))
        observability.add_sink(metrics.MetricsSink(metrics.aggregate))
        # As many jobs made whatever N (up to 5,000), so that the difference of
        # two runs is the attempts alone, not the making of their jobs.
        jobs = _jobs(5300, [None])
        _cycle(jobs[5000:])  # warm up, as in the run with 0
        if options.callgrind:
            _cycle(jobs[: min(options.callgrind, 5000)])
        return
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))

    def carriers(p: Any) -> list[dict[str, Any] | None]:
        """The contexts enqueues in a traced process would store (one per job)."""
        sink = tracing.TracingSink(tracer_provider=p)
        out = []
        for _ in range(200):
            meta = sink.enqueuing(None, [JobInsertParams(kind="bench.jobs.noop", queue="bench")])
            sink.enqueued(None, [], [])
            out.append((meta or {}).get("otel"))
        return out

    setups: dict[str, Callable[[], list[Any]]] = {
        "off": lambda: [],
        "tracing, every job sampled": lambda: [tracing.TracingSink(tracer_provider=full)],
        f"tracing, parent-based {options.ratio:g}": lambda: [
            tracing.TracingSink(tracer_provider=sampled)
        ],
        "metrics, Prometheus exporter": lambda: [metrics.MetricsSink(metrics.aggregate)],
        "metrics, OpenTelemetry exporter": lambda: [
            metrics.MetricsSink(metrics.aggregate, metrics.OTelMetrics())
        ],
    }
    # Jobs enqueued outside any trace (bench.run seeds its jobs in SQL): each
    # attempt is the root of a trace of its own, decided by the root sampler.
    untraced = f"tracing, parent-based {options.ratio:g}, jobs without a trace"
    setups[untraced] = lambda: [tracing.TracingSink(tracer_provider=sampled)]
    setups[f"{untraced} + Prometheus"] = lambda: [
        tracing.TracingSink(tracer_provider=sampled),
        metrics.MetricsSink(metrics.aggregate),
    ]
    ctx = {"tracing, every job sampled": full, f"tracing, parent-based {options.ratio:g}": sampled}
    for name, make in setups.items():
        p = ctx.get(name)
        stored: list[dict[str, Any] | None] = carriers(p) if p is not None else [None]
        jobs = _jobs(options.jobs, stored)
        added = [observability.add_sink(s) for s in make()]
        try:
            _cycle(jobs[:200])  # warm up
            best = min(_cycle(jobs) for _ in range(options.rounds))
            calls = f", {_calls(jobs):6.1f} calls" if options.calls else ""
        finally:
            for s in added:
                observability.remove_sink(s)
        print(f"{name:62} {best:8.1f} µs per job{calls}")


if __name__ == "__main__":
    main()
