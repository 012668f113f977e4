"""Job metrics: OpenTelemetry instruments and a Prometheus exposition.

Counters by queue and kind, histograms of run duration and pickup latency, fed
by the job signals (:class:`MetricsSink`) into plain per-process totals
(:class:`Aggregate`: a record appended per attempt event, folded into the
totals when they are read) that the exporters read when metrics are
collected; gauges of queue depth by state and the oldest waiting job's age,
read from the database when metrics are collected, never per job
(:class:`QueueDepth`: one ``stats()`` call per collection, shared by both
exporters, cluster-wide); and the gauges of the workers of this process
(slots, busy slots, claim sizes), read from the workers' own counters at
collection.

One exporter per process (``HOPPER["METRICS"]``: ``"prometheus"``, ``"otel"``,
False for none; None or True choose, see :func:`exporter`):

* OpenTelemetry (``opentelemetry-api``): a ``django_hopper`` meter on the
  global ``MeterProvider``; configure an SDK and a reader/exporter as usual.
  Its counters are observable (read from the totals); its two histograms are
  recorded per attempt, the API having no observable histogram.
* Prometheus (``prometheus-client``): one collector on the client's default
  registry, served by ``hopper_worker --metrics-port`` (:func:`serve`) or by
  the :func:`django_hopper.observability.views.metrics` view. Both read the
  same totals, so either serves the Prometheus exposition whatever the
  exporter, at no cost per job.

Names (Prometheus; OpenTelemetry uses the dotted form, e.g. ``hopper.jobs.completed``):

========================================  ================  ==========================
``hopper_jobs_enqueued_total``            counter           queue, kind
``hopper_jobs_completed_total``           counter           queue, kind
``hopper_jobs_failed_total``              counter           queue, kind (error raised)
``hopper_jobs_retried_total``             counter           queue, kind
``hopper_jobs_discarded_total``           counter           queue, kind
``hopper_jobs_cancelled_total``           counter           queue, kind
``hopper_jobs_rescued_total``             counter           queue, kind
``hopper_job_duration_seconds``           histogram         queue, kind
``hopper_job_pickup_latency_seconds``     histogram         queue
``hopper_queue_jobs``                     gauge             queue, state
``hopper_queue_oldest_available_seconds`` gauge             queue
``hopper_queue_paused``                   gauge             queue
``hopper_clients_live``                   gauge
``hopper_worker_slots``                   gauge             queue (this process)
``hopper_worker_busy_slots``              gauge             queue (this process)
``hopper_worker_claim_batch_size``        gauge             queue (the last claim)
``hopper_worker_claims_total``            counter           queue
``hopper_worker_claimed_jobs_total``      counter           queue
========================================  ================  ==========================
"""

from __future__ import annotations

import bisect
import logging
import operator
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from itertools import groupby, repeat, starmap
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_hopper import __version__, queues, topology
from django_hopper.conf import hopper_settings
from django_hopper.engine import get_engine
from django_hopper.observability import Sink, add_sink

if TYPE_CHECKING:
    from django_hopper.types import JobRow, Stats
    from django_hopper.worker import Worker

logger = logging.getLogger("django_hopper.observability")

#: The job events counted, by queue and kind.
EVENTS = ("enqueued", "completed", "failed", "retried", "discarded", "cancelled", "rescued")
#: Buckets of both histograms (seconds): from a no-op job to an hour-long one.
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Job states the depth gauges report.
DEPTH_STATES = ("available", "scheduled", "retryable", "running")


def prometheus_available() -> bool:
    """Return whether ``prometheus-client`` is installed."""
    try:
        import prometheus_client  # noqa: F401, PLC0415 - optional dependency
    except ImportError:
        return False
    return True


def otel_available() -> bool:
    """Return whether ``opentelemetry-api`` is installed."""
    try:
        from opentelemetry import metrics  # noqa: F401, PLC0415 - optional dependency
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------
# What is read at collection: queue depths (one query) and this process's workers


class QueueDepth:
    """Cluster-wide queue depths from one ``stats()`` call, shared for ``max_age`` seconds.

    Every exporter reads the same snapshot, so a collection costs one query
    however many gauges (and exporters) read it; a scrape storm costs one
    query per ``max_age``. The connection is closed again when the scrape
    thread opened it (the Prometheus server's threads are not Django's).
    """

    def __init__(self, max_age: float = 1.0) -> None:
        self.max_age = max_age
        self._lock = threading.Lock()
        self._at = -1e9
        self._stats: Stats | None = None
        self.queries = 0

    def read(self) -> Stats | None:
        """Return the latest snapshot, querying when it is older than ``max_age``."""
        with self._lock:
            if time.monotonic() - self._at < self.max_age:
                return self._stats
            self._stats = self._query()
            self._at = time.monotonic()
            return self._stats

    def _query(self) -> Stats | None:

        aliases = [get_engine(alias).alias for alias in topology.aliases()]
        opened = [alias for alias in aliases if connections[alias].connection is None]
        try:
            self.queries += 1
            return queues.stats()
        except Exception:
            logger.warning("reading queue depths for metrics failed", exc_info=True)
            return None
        finally:
            for alias in opened:  # every alias stats() read: one query each
                if not connections[alias].in_atomic_block:
                    connections[alias].close()


depth = QueueDepth()

#: The workers running in this process (for the worker gauges).
_workers: weakref.WeakSet[Worker] = weakref.WeakSet()


def _producers() -> Iterator[tuple[str, Any]]:
    for worker in list(_workers):
        yield from worker.producers.items()


def worker_gauges() -> dict[str, dict[str, float]]:
    """Return the workers' gauges of this process by name, then by queue."""
    names = ("slots", "busy_slots", "claim_batch_size", "claims", "claimed_jobs")
    out: dict[str, dict[str, float]] = {name: {} for name in names}
    for queue, p in _producers():
        for name, value in (
            ("slots", p.concurrency),
            ("busy_slots", p.running),
            ("claims", p.claims),
            ("claimed_jobs", p.claimed),
        ):
            out[name][queue] = out[name].get(queue, 0) + value
        out["claim_batch_size"][queue] = p.last_batch
    return out


# ---------------------------------------------------------------------------
# What is recorded per job: plain counts and bucket counts, read at collection


#: What an attempt's outcome counts, by the state it ended in.
_OUTCOMES: dict[str, tuple[str, ...]] = {
    "completed": ("completed",),
    "retryable": ("failed", "retried"),
    "discarded": ("failed", "discarded"),
    "canceled": ("cancelled",),
}


class Aggregate:
    """This process's job counters and histograms, in plain dicts.

    An attempt's pickup and ending are appended as records to two queues
    (``deque.append`` is atomic: no lock and no lookup in the job's thread,
    only the value and its bucket) and folded into the totals when
    they are read (a scrape, an OpenTelemetry collection) or when
    :attr:`FOLD_AT` records wait. A read folds first, so it sees every
    attempt whose signal was sent before it: the numbers are as exact and as
    prompt as when each attempt was added alone under the lock, for about
    two thirds of the instructions (the fold counts records by key in one
    ``Counter`` pass and looks each key up once). The
    exporters read these totals, so a job pays for its numbers once
    whichever reads them.
    """

    #: Records waiting before the thread that appends the next folds them:
    #: bounds the memory of a process whose metrics are never read.
    FOLD_AT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (event, queue, kind) -> jobs.
        self._counts: dict[tuple[str, str, str], int] = {}
        #: (histogram, queue, kind) -> count per bucket (the last: above every
        #: bound), then the sum of the values.
        self._histograms: dict[tuple[str, str, str], list[float]] = {}
        #: Pickups not folded yet: (queue, the latency's bucket, the latency).
        self._pickups: deque[tuple[str, int, float]] = deque()
        #: Endings not folded yet: (queue, kind, state, the duration's bucket
        #: or None when unseen, the duration or 0.0).
        self._endings: deque[tuple[str, str, str, int | None, float]] = deque()

    def count(self, event: str, queue: str, kind: str, n: int = 1) -> None:
        """Add ``n`` jobs to an event's count."""
        key = (event, queue, kind)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def observe(self, histogram: str, queue: str, kind: str, value: float) -> None:
        """Add one value to a histogram (``kind`` "" for one by queue only)."""
        with self._lock:
            self._observe(histogram, queue, kind, value)

    def started(self, job: JobRow) -> None:
        """Record an attempt's pickup latency (claim less scheduled time), to fold."""
        attempted_at = job.attempted_at
        if attempted_at is None:
            return
        waited = (attempted_at - job.scheduled_at).total_seconds()
        if waited < 0.0:  # a clock ahead of the scheduler's makes no negative wait
            waited = 0.0
        pickups = self._pickups
        pickups.append((job.queue, bisect.bisect_left(BUCKETS, waited), waited))
        if len(pickups) >= self.FOLD_AT:
            self.fold()

    def finished(
        self, job: JobRow, state: str, error: BaseException | str | None, duration: float | None
    ) -> None:
        """Record an attempt's outcome and duration (its bucket: None if unseen), to fold."""
        endings = self._endings
        if duration is None:  # its start unseen: counted, no duration (0.0 adds nothing)
            endings.append((job.queue, job.kind, state, None, 0.0))
        else:  # Prometheus' ``le``: a value equal to a bound counts in that bound's bucket
            endings.append(
                (job.queue, job.kind, state, bisect.bisect_left(BUCKETS, duration), duration)
            )
        if len(endings) >= self.FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Add the waiting records to the totals (appends may go on meanwhile).

        Records are counted alike first (one ``Counter`` pass in C over a
        pickup's queue and bucket, an ending's queue, kind, state and bucket),
        so the lookups and increments are paid once per distinct key, not per
        job; the sums are added by runs of one key (one C ``sum`` a run).
        """
        with self._lock:
            # popleft only, as many as wait now: a record appended meanwhile
            # waits for the next fold; none is lost or folded twice.
            # (``starmap`` calls popleft n times in C: no Python loop per record.)
            pickups = list(starmap(self._pickups.popleft, repeat((), len(self._pickups))))
            endings = list(starmap(self._endings.popleft, repeat((), len(self._endings))))
            for (queue, bucket), n in Counter(map(_QUEUE_BUCKET, pickups)).items():
                self._buckets("latency", queue, "")[bucket] += n
            for queue, waits in groupby(pickups, key=_FIRST):
                self._buckets("latency", queue, "")[-1] += sum(map(_THIRD, waits))
            if not endings:
                return
            counts, histograms = self._counts, self._histograms
            for (queue, kind, state, bucket), n in Counter(map(_ENDING_KEY, endings)).items():
                for event in _OUTCOMES.get(state, ()):
                    key = (event, queue, kind)
                    counts[key] = counts.get(key, 0) + n
                if bucket is not None:
                    self._buckets("duration", queue, kind)[bucket] += n
            for (queue, kind), ran in groupby(endings, key=_QUEUE_KIND):
                per_bucket = histograms.get(("duration", queue, kind))
                if per_bucket is not None:
                    per_bucket[-1] += sum(map(_DURATION, ran))

    def _buckets(self, histogram: str, queue: str, kind: str) -> list[float]:
        """Return a histogram's counts per bucket, then its sum (made empty on first use)."""
        key = (histogram, queue, kind)
        per_bucket = self._histograms.get(key)
        if per_bucket is None:
            per_bucket = self._histograms[key] = [0.0] * (len(BUCKETS) + 2)
        return per_bucket

    def _observe(self, histogram: str, queue: str, kind: str, value: float) -> None:
        per_bucket = self._buckets(histogram, queue, kind)
        per_bucket[bisect.bisect_left(BUCKETS, value)] += 1  # Prometheus' ``le``: value <= bound
        per_bucket[-1] += value

    def counts(self) -> dict[tuple[str, str, str], int]:
        """Return a copy of the counts, every attempt recorded so far folded in."""
        self.fold()
        with self._lock:
            return dict(self._counts)

    def histograms(self) -> dict[tuple[str, str, str], list[float]]:
        """Return a copy of the histograms, every attempt recorded so far folded in."""
        self.fold()
        with self._lock:
            return {key: list(counts) for key, counts in self._histograms.items()}


#: A pickup record's queue, (queue, bucket), latency.
_FIRST = operator.itemgetter(0)
_QUEUE_BUCKET = operator.itemgetter(0, 1)
_THIRD = operator.itemgetter(2)
#: An ending record's (queue, kind, state, bucket), its (queue, kind), its duration.
_ENDING_KEY = operator.itemgetter(0, 1, 2, 3)
_QUEUE_KIND = operator.itemgetter(0, 1)
_DURATION = operator.itemgetter(4)


#: This process's job numbers: the one thing the sink records into.
aggregate = Aggregate()


# ---------------------------------------------------------------------------
# Exporters


#: Prometheus histograms: (name in the aggregate, metric, labels, help).
_PROMETHEUS_HISTOGRAMS = (
    (
        "duration",
        "hopper_job_duration_seconds",
        ("queue", "kind"),
        "How long attempts ran, by queue and kind.",
    ),
    (
        "latency",
        "hopper_job_pickup_latency_seconds",
        ("queue",),
        "Time from a job's scheduled time (or insert) to its claim, by queue.",
    ),
)


class PrometheusMetrics:
    """The Prometheus exposition: one collector on the client's default registry.

    Everything is read at scrape time: the job counters and histograms from
    :data:`aggregate`, the queue depths from one ``stats()`` call, the worker
    gauges from the producers.
    """

    def __init__(self, registry: Any = None) -> None:
        import prometheus_client as pc  # noqa: PLC0415 - optional dependency

        self.registry = registry if registry is not None else pc.REGISTRY
        self.registry.register(_Collector())


class _Collector:
    """The metrics read at scrape time: job numbers, queue depths (one query), workers."""

    def describe(self) -> list[Any]:
        return []  # collected lazily: never query the database at registration

    def collect(self) -> Iterator[Any]:
        yield from self._jobs()
        yield from self._depths()
        yield from self._workers()

    def _jobs(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily  # noqa: PLC0415 - optional dependency
        from prometheus_client.utils import floatToGoString  # noqa: PLC0415 - optional dependency

        counts = aggregate.counts()
        for event in EVENTS:
            family = CounterMetricFamily(
                f"hopper_jobs_{event}",
                f"Jobs {event}, by queue and kind.",
                labels=["queue", "kind"],
            )
            for (name, queue, kind), n in sorted(counts.items()):
                if name == event:
                    family.add_metric([queue, kind], n)
            yield family
        histograms = aggregate.histograms()
        bounds = [floatToGoString(b) for b in BUCKETS] + ["+Inf"]
        for name, metric, labels, doc in _PROMETHEUS_HISTOGRAMS:
            histogram = HistogramMetricFamily(metric, doc, labels=list(labels))
            for (hist, queue, kind), per_bucket in sorted(histograms.items()):
                if hist != name:
                    continue
                cumulative, buckets = 0.0, []
                for bound, seen in zip(bounds, per_bucket[:-1], strict=True):
                    cumulative += seen
                    buckets.append((bound, cumulative))
                values = [queue, kind] if len(labels) == 2 else [queue]
                histogram.add_metric(values, buckets, per_bucket[-1])
            yield histogram

    def _depths(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415 - optional dependency

        stats = depth.read()
        if stats is None:
            return
        jobs = GaugeMetricFamily(
            "hopper_queue_jobs", "Jobs in each live state, by queue.", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "hopper_queue_oldest_available_seconds",
            "Age of the oldest job that could be claimed now, by queue.",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "hopper_queue_paused", "1 while a queue is paused.", labels=["queue"]
        )
        for name, q in sorted(stats.queues.items()):
            for state in DEPTH_STATES:
                jobs.add_metric([name, state], getattr(q, state))
            oldest.add_metric([name], q.oldest_available.total_seconds())
            paused.add_metric([name], 1.0 if q.paused else 0.0)
        yield jobs
        yield oldest
        yield paused
        yield GaugeMetricFamily(
            "hopper_clients_live", "Workers with a live lease.", value=stats.live_clients
        )

    def _workers(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415 - optional dependency

        gauges = worker_gauges()
        for name, doc in (
            ("slots", "Jobs this process's workers may run at once, by queue."),
            ("busy_slots", "Jobs this process's workers are running, by queue."),
            ("claim_batch_size", "Jobs the latest claim of each queue took."),
        ):
            family = GaugeMetricFamily(f"hopper_worker_{name}", doc, labels=["queue"])
            for queue, value in sorted(gauges[name].items()):
                family.add_metric([queue], value)
            yield family
        for name, doc in (
            ("claims", "Claims this process's workers made, by queue."),
            ("claimed_jobs", "Jobs this process's workers claimed, by queue."),
        ):
            counter = CounterMetricFamily(f"hopper_worker_{name}", doc, labels=["queue"])
            for queue, value in sorted(gauges[name].items()):
                counter.add_metric([queue], value)
            yield counter


class OTelMetrics:
    """The metrics as OpenTelemetry instruments on the ``django_hopper`` meter.

    The counters are observable: the SDK reads :data:`aggregate`'s totals at
    each collection, so a job costs no instrument call for them. The API has
    no observable histogram, so the two histograms are recorded per attempt
    (:meth:`observe_duration`, :meth:`observe_latency`): the only per-job cost
    of this exporter.
    """

    def __init__(self, meter_provider: Any = None) -> None:
        from opentelemetry import metrics  # noqa: PLC0415 - optional dependency

        meter = metrics.get_meter("django_hopper", __version__, meter_provider=meter_provider)
        #: Attribute dicts by (queue, kind), made once (they are read, never changed).
        self._attrs: dict[tuple[str, str], dict[str, str]] = {}
        for event in EVENTS:
            meter.create_observable_counter(
                f"hopper.jobs.{event}",
                callbacks=[self._counter(event)],
                unit="{job}",
                description=f"Jobs {event}.",
            )
        self.duration = meter.create_histogram(
            "hopper.job.duration", unit="s", description="How long attempts ran."
        )
        self.latency = meter.create_histogram(
            "hopper.job.pickup_latency",
            unit="s",
            description="Time from a job's scheduled time (or insert) to its claim.",
        )
        meter.create_observable_gauge(
            "hopper.queue.jobs",
            callbacks=[self._queue_jobs],
            unit="{job}",
            description="Jobs in each live state, by queue.",
        )
        meter.create_observable_gauge(
            "hopper.queue.oldest_available",
            callbacks=[self._oldest],
            unit="s",
            description="Age of the oldest job that could be claimed now.",
        )
        meter.create_observable_gauge(
            "hopper.worker.busy_slots",
            callbacks=[self._worker("busy_slots")],
            unit="{slot}",
            description="Jobs this process's workers are running.",
        )
        meter.create_observable_gauge(
            "hopper.worker.slots",
            callbacks=[self._worker("slots")],
            unit="{slot}",
            description="Jobs this process's workers may run at once.",
        )
        meter.create_observable_gauge(
            "hopper.worker.claim_batch_size",
            callbacks=[self._worker("claim_batch_size")],
            unit="{job}",
            description="Jobs the latest claim of each queue took.",
        )

    def _attributes(self, queue: str, kind: str) -> dict[str, str]:
        key = (queue, kind)
        attributes = self._attrs.get(key)
        if attributes is None:
            attributes = self._attrs[key] = (
                {"queue": queue, "kind": kind} if kind else {"queue": queue}
            )
        return attributes

    def observe_duration(self, queue: str, kind: str, seconds: float) -> None:
        self.duration.record(seconds, self._attributes(queue, kind))

    def observe_latency(self, queue: str, kind: str, seconds: float) -> None:
        self.latency.record(seconds, self._attributes(queue, ""))

    def _counter(self, event: str) -> Any:
        def callback(options: Any) -> Iterator[Any]:
            from opentelemetry.metrics import Observation  # noqa: PLC0415 - optional dependency

            for (name, queue, kind), n in sorted(aggregate.counts().items()):
                if name == event:
                    yield Observation(n, self._attributes(queue, kind))

        return callback

    def _queue_jobs(self, options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation  # noqa: PLC0415 - optional dependency

        stats = depth.read()
        for name, q in sorted((stats.queues if stats else {}).items()):
            for state in DEPTH_STATES:
                yield Observation(getattr(q, state), {"queue": name, "state": state})

    def _oldest(self, options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation  # noqa: PLC0415 - optional dependency

        stats = depth.read()
        for name, q in sorted((stats.queues if stats else {}).items()):
            yield Observation(q.oldest_available.total_seconds(), {"queue": name})

    def _worker(self, name: str) -> Any:
        def callback(options: Any) -> Iterator[Any]:
            from opentelemetry.metrics import Observation  # noqa: PLC0415 - optional dependency

            for queue, value in sorted(worker_gauges()[name].items()):
                yield Observation(value, {"queue": queue})

        return callback


# ---------------------------------------------------------------------------
# The sink


class MetricsSink(Sink):
    """Count job events and time attempts into the aggregate (and OTel's histograms).

    ``histograms`` is the OpenTelemetry exporter when it is this process's
    exporter (it records its two histograms per attempt), else None.
    """

    wants = frozenset(
        {"enqueued", "started", "finished", "ended", "rescued", "worker_started", "worker_stopped"}
    )

    def __init__(self, numbers: Aggregate | None = None, histograms: Any = None) -> None:
        self.numbers = numbers if numbers is not None else aggregate
        self.histograms = histograms
        if histograms is None:
            # Per attempt, the hub calls the aggregate's own recorders: no call between.
            self.started = self.numbers.started  # type: ignore[method-assign]
            self.finished = self.numbers.finished  # type: ignore[method-assign]

    def enqueued(self, sender: Any, jobs: Sequence[JobRow], duplicates: Sequence[JobRow]) -> None:
        """Count inserted jobs (duplicates were not inserted)."""
        by: Counter[tuple[str, str]] = Counter((j.queue, j.kind) for j in jobs)
        for (queue, kind), n in by.items():
            self.numbers.count("enqueued", queue, kind, n)

    def started(self, job: JobRow) -> None:
        """Record the pickup latency: from the job's scheduled time to its claim."""
        self.numbers.started(job)
        attempted_at = job.attempted_at
        if self.histograms is not None and attempted_at is not None:
            waited = (attempted_at - job.scheduled_at).total_seconds()
            self.histograms.observe_latency(job.queue, job.kind, max(waited, 0.0))

    def finished(
        self, job: JobRow, state: str, error: BaseException | str | None, duration: float | None
    ) -> None:
        """Count the attempt's outcome and record its duration."""
        self.numbers.finished(job, state, error, duration)
        if duration is not None and self.histograms is not None:
            self.histograms.observe_duration(job.queue, job.kind, duration)

    def ended(self, jobs: Sequence[JobRow]) -> None:
        """Count jobs ended outside an attempt (expired, rescued out of attempts, canceled)."""
        for job in jobs:
            if job.state == "canceled":
                self.numbers.count("cancelled", job.queue, job.kind)
            elif job.state == "discarded":
                self.numbers.count("discarded", job.queue, job.kind)

    def rescued(self, jobs: Sequence[JobRow]) -> None:
        """Count rescued attempts (their endings are counted by ``ended``; retries here)."""
        for job in jobs:
            self.numbers.count("rescued", job.queue, job.kind)
            if job.state == "retryable":
                self.numbers.count("retried", job.queue, job.kind)

    def worker_started(self, worker: Worker) -> None:
        """Watch the worker's slots and claims."""
        _workers.add(worker)

    def worker_stopped(self, worker: Worker) -> None:
        """Stop watching the worker."""
        _workers.discard(worker)


_prometheus: PrometheusMetrics | None = None
_otel: OTelMetrics | None = None
_sink: MetricsSink | None = None


def prometheus() -> PrometheusMetrics:
    """Return this process's Prometheus exposition, registered on first use."""
    global _prometheus
    if _prometheus is None:
        _prometheus = PrometheusMetrics()
    return _prometheus


def otel_configured() -> bool:
    """Return whether an OpenTelemetry SDK ``MeterProvider`` is set globally."""
    if not otel_available():
        return False
    from opentelemetry import metrics as otel_metrics  # noqa: PLC0415 - optional dependency

    provider = type(otel_metrics.get_meter_provider()).__name__
    return provider not in ("_ProxyMeterProvider", "NoOpMeterProvider")


def exporter() -> str | None:
    """Return this process's metrics exporter: "prometheus", "otel" or None.

    ``HOPPER["METRICS"]`` names it; None or True choose: OpenTelemetry when an
    SDK ``MeterProvider`` is configured by then, else Prometheus when
    ``prometheus-client`` is installed, else OpenTelemetry when its API is.
    One per process, so that no number is recorded twice.
    """
    setting = hopper_settings.METRICS
    if setting is False:
        return None
    if setting == "prometheus":
        return "prometheus" if prometheus_available() else None
    if setting == "otel":
        return "otel" if otel_available() else None
    if otel_configured():
        return "otel"
    if prometheus_available():
        return "prometheus"
    return "otel" if otel_available() else None


def setup() -> MetricsSink | None:
    """Turn on this process's exporter and the sink that feeds it; return the sink, if any."""
    global _sink, _otel
    if _sink is not None:
        return _sink
    chosen = exporter()
    if chosen is None:
        return None
    if chosen == "prometheus":
        prometheus()
    elif _otel is None:
        _otel = OTelMetrics()
    _sink = MetricsSink(aggregate, _otel if chosen == "otel" else None)
    add_sink(_sink)
    return _sink


def serve(port: int, host: str = "127.0.0.1") -> Any:
    """Serve the Prometheus metrics over HTTP on ``host:port`` (a daemon thread).

    Raises ImproperlyConfigured without ``prometheus-client``.
    """

    if not prometheus_available():
        raise ImproperlyConfigured(
            "--metrics-port needs prometheus-client: pip install 'django-hopper[prometheus]'"
        )
    import prometheus_client  # noqa: PLC0415 - optional dependency

    setup()
    prometheus()
    served = prometheus_client.start_http_server(port, addr=host)
    logger.info("serving Prometheus metrics on http://%s:%d/metrics", host, port)
    return served
