"""CPU per job of a real worker with tracing and metrics off and on.

By default one process, SQLite in a temporary file, the bench's no-op jobs
seeded in SQL, then a worker's ``run_once`` until the queue is empty, under
each set-up in turn, alternating for ``--rounds``. CPU is the process's (every
thread), so the figure is what a job costs the machine, whatever else runs on
it:

    python -m bench.observe_cpu --jobs 3000 --rounds 3

``--workers`` runs real ``hopper_worker --burst`` processes instead, as
``bench.run`` does, off and the target's set-up (tracing parent-based 0.1, the
Prometheus exporter) alternated, each round an idle worker and one that works
``--jobs``; CPU per job is (the least loaded CPU - the least idle CPU) / jobs
per set-up, the least of the rounds being what a loaded machine moves least.
``--engine postgres`` uses ``BENCH_PG_DB``:

    python -m bench.observe_cpu --workers --jobs 6000 --rounds 4 --engine sqlite

``--callgrind off|on`` works ``--jobs`` jobs in one in-process worker and
nothing else, for machine instructions per job, which no load moves (each
round one claim and one flush, as a real worker batches at this load:
``instructions``; ``--unpinned`` leaves the batches to the slowed clock):

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python -m bench.observe_cpu --callgrind on --jobs 2000   # and --jobs 0; and off
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    """Print CPU µs per job of each set-up, and its extra over off in the same round."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workers", action="store_true", help="Real hopper_worker --burst processes."
    )
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--callgrind",
        choices=("off", "on"),
        default=None,
        help="Only work --jobs jobs (0: none) in one in-process SQLite worker, off or with "
        "the target's set-up as bench.settings turns it on (random IDs seeded), for valgrind "
        "--tool=callgrind: (instructions with N - with 0) / N is instructions per job.",
    )
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="With --callgrind: leave the worker's batches to its clock (see instructions()).",
    )
    options = parser.parse_args()
    if options.engine == "postgres" and not options.workers:
        parser.error("--engine postgres needs --workers")
    os.environ["BENCH_ENGINE"] = options.engine
    os.environ.setdefault("BENCH_SQLITE_FILE", os.path.join(tempfile.mkdtemp(), "observe.sqlite3"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    if options.workers:
        workers(options.jobs, options.rounds)
        return
    if options.callgrind is not None:
        instructions(options.jobs, on=options.callgrind == "on", pinned=not options.unpinned)
        return

    import django

    django.setup()
    from django.db import connection
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    import bench.jobs  # noqa: F401 - registers the no-op job
    from bench import raw
    from bench.observe import DropExporter
    from bench.run import prepare_database
    from django_hopper import observability
    from django_hopper.engine import get_engine
    from django_hopper.observability import metrics, tracing
    from django_hopper.worker import Worker, WorkerConfig

    prepare_database()

    def tracer(ratio: float) -> Any:
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        provider.add_span_processor(BatchSpanProcessor(DropExporter()))
        return tracing.TracingSink(tracer_provider=provider)

    def otel_metrics() -> Any:
        return metrics.MetricsSink(metrics.aggregate, metrics.OTelMetrics())

    setups = {
        "off": list,
        "tracing every job + OTel metrics": lambda: [tracer(1.0), otel_metrics()],
        "tracing parent-based 0.1 + OTel metrics": lambda: [tracer(0.1), otel_metrics()],
        "tracing parent-based 0.1 + Prometheus": lambda: [
            tracer(0.1),
            metrics.MetricsSink(metrics.aggregate),
        ],
    }
    results: dict[str, list[float]] = {name: [] for name in setups}
    engine = get_engine()
    for _ in range(options.rounds):
        for name, make in setups.items():
            statement, params = raw.seed_sql(
                "sqlite", queue="bench", state="available", n=options.jobs
            )
            with connection.cursor() as c:
                c.execute(statement, params)
            added = [observability.add_sink(s) for s in make()]
            worker = Worker(WorkerConfig(queues={"bench": 10}, maintenance=False), engine)
            try:
                start = time.process_time()
                done = 0
                while done < options.jobs:
                    ran = worker.run_once()
                    if not ran:
                        break
                    done += ran
                results[name].append((time.process_time() - start) / max(done, 1) * 1e6)
            finally:
                worker.shutdown()
                for s in added:
                    observability.remove_sink(s)
    # Each round's set-ups run back to back: the extra over off of the same
    # round is the figure (the machine's load moves between rounds).
    for name, values in results.items():
        extra = [v - off for v, off in zip(values, results["off"], strict=True)]
        print(
            f"{name:42} {statistics.median(values):8.1f} µs CPU per job, extra over off "
            f"{statistics.median(extra):+.1f} (rounds {min(extra):+.0f} .. {max(extra):+.0f})"
        )


#: The target's set-up (bench.settings reads these in the worker).
TARGET = {
    "BENCH_OBSERVE": "1",
    "BENCH_OBSERVE_RATIO": "0.1",
    "BENCH_OBSERVE_EXPORTER": "prometheus",
}


def instructions(jobs: int, *, on: bool, pinned: bool = True) -> None:
    """Work ``jobs`` jobs in one in-process worker, nothing else (for callgrind).

    ``pinned``: every round is one claim of the slots and the buffer (100
    jobs at the bench's concurrency, 9 ahead per slot) and one flush of their
    results, as a real worker batches them at this load off and on alike
    (about 10 claims and 5-10 flushes per 1,000 jobs). The worker decides
    its batches by the clock (the running mean of run times against
    ``AHEAD_MAX_RUN``, the completer's flush interval), and under callgrind
    the clock runs about 50 times slower: unpinned, off claimed 34 times and
    flushed 43 times per 1,000 jobs, on (slower still) 85 and 121, so the
    set-up was charged with claims, commits and WAL pages a real worker does
    not spend (about 76,000 instructions of its 141,000 per job).
    """
    import random

    if on:
        os.environ.update(TARGET)
    import django

    django.setup()
    from django.db import connection

    import bench.jobs  # noqa: F401 - registers the no-op job
    from bench import raw
    from bench.run import prepare_database
    from django_hopper.engine import get_engine
    from django_hopper.worker import Worker, WorkerConfig

    prepare_database()
    random.seed(7)  # the SDK's trace IDs, hence which attempts are sampled
    if jobs:
        with connection.cursor() as c:
            c.execute(*raw.seed_sql("sqlite", queue="bench", state="available", n=jobs))
    worker = Worker(WorkerConfig(queues={"bench": 10}, maintenance=False), get_engine())
    worker.setup()
    done = 0
    try:
        while done < jobs:
            ran = pinned_round(worker) if pinned else worker.run_once()
            if not ran:
                break
            done += ran
    finally:
        worker.shutdown()


def pinned_round(worker: Any) -> int:
    """Run one round as ``Worker.run_once`` does, its batches pinned; return the jobs claimed.

    One claim of the slots and the full buffer, as a real worker claims at
    this load whatever the slowed clock made of the running mean of run times,
    and one flush of the round's results once every attempt returned.
    """
    completer = worker.completer
    completer.flush_interval = 3600.0  # no flush by the clock during the round
    for p in worker.producers.values():
        p.mean_run = 0.0
        p.full = True
    claimed = sum(p.claim_once() for p in worker.producers.values())
    while worker.running():
        worker.activity.wait(0.01)
        worker.activity.clear()
    completer.flush_interval = 0.0  # the round's one flush, now
    completer.drain(30.0)
    return claimed


def workers(jobs: int, rounds: int) -> None:
    """Print CPU µs per job of real burst workers, off and with the target's set-up on."""
    import django

    django.setup()
    from django.db import connection, connections

    from bench import raw
    from bench.run import RESET_TABLES, Children, prepare_database, worker_command

    prepare_database()
    log = Path(tempfile.mkdtemp()) / "workers.log"
    vendor = connection.vendor
    setups: dict[str, dict[str, str]] = {"off": {}, "on": TARGET}
    cpu: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for n in (0, jobs):
            for name, env in setups.items():
                with connection.cursor() as c:
                    for table in RESET_TABLES:
                        c.execute(f"DELETE FROM {table}")
                    if n:
                        c.execute(*raw.seed_sql(vendor, queue="bench", state="available", n=n))
                connections.close_all()
                spent = Children([worker_command(burst=True)], log, env).wait(120 + n / 50)
                cpu.setdefault((name, n), []).append(spent)
    per_job = {name: (min(cpu[(name, jobs)]) - min(cpu[(name, 0)])) / jobs * 1e6 for name in setups}
    for name in setups:
        print(
            f"{vendor} {name:4} idle {min(cpu[(name, 0)]):.3f} s, {jobs} jobs "
            f"{min(cpu[(name, jobs)]):.3f} s (least of {rounds}): "
            f"{per_job[name]:.1f} µs CPU per job"
        )
    extra = per_job["on"] - per_job["off"]
    print(
        f"{vendor} tracing parent-based 0.1 + Prometheus: +{extra:.1f} µs per job; "
        f"a CPU-bound worker keeps {per_job['off'] / per_job['on']:.2f} of its throughput"
    )


if __name__ == "__main__":
    main()
