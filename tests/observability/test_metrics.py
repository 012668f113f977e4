"""Metrics: the Prometheus endpoint of a real worker during a run, the view, the sink's rules."""

from __future__ import annotations

import datetime as dt
import socket
import urllib.request
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.urls import path

from django_hopper import queues
from django_hopper.observability import metrics
from django_hopper.observability.views import metrics as metrics_view
from tests.support.runtime import Processes, wait_for
from tests.testapp import jobs

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

urlpatterns = [path("metrics", metrics_view), path("admin/", admin.site.urls)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Return every sample of an exposition by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scraped: dict, name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


class Scraper:
    """Scrape a worker's endpoint until a condition holds (a deadline, no fixed sleeps)."""

    def __init__(self, port: int, procs: Processes) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.procs = procs

    def scrape(self) -> dict:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                return samples(response.read().decode())
        except OSError:
            return {}

    def until(self, condition: Any, timeout: float = 30.0) -> dict:
        last: dict = {}

        def check() -> bool:
            nonlocal last
            last = self.scrape()
            return bool(last) and condition(last)

        try:
            wait_for(check, timeout=timeout, step=0.05)
        except BaseException:
            print(self.procs.logs())
            print({k: v for k, v in last.items() if k[0].startswith("hopper_")})
            raise
        return last


ADD = "tests.testapp.jobs.add"
FAIL = "tests.testapp.jobs.fail"


@pytest.mark.processes
def test_metrics_endpoint__counters_move_and_depth_is_right_during_a_run(tx_engine, processes):
    for i in range(3):
        jobs.add.enqueue(i, i)
    for _ in range(2):
        jobs.fail.using(max_attempts=1).enqueue("nope")
    for i in range(4):
        jobs.add.using(run_after=dt.timedelta(hours=1)).enqueue(i, 0)
    port = free_port()
    processes.start("--queues", "default:2", "--metrics-port", str(port))
    scraper = Scraper(port, processes)

    first = scraper.until(
        lambda s: (
            value(s, "hopper_jobs_completed_total", queue="default", kind=ADD) == 3
            and value(s, "hopper_jobs_discarded_total", queue="default", kind=FAIL) == 2
        )
    )
    assert value(first, "hopper_jobs_failed_total", queue="default", kind=FAIL) == 2
    assert value(first, "hopper_job_duration_seconds_count", queue="default", kind=ADD) == 3
    assert value(first, "hopper_job_pickup_latency_seconds_count", queue="default") == 5
    assert value(first, "hopper_worker_slots", queue="default") == 2
    assert value(first, "hopper_worker_claimed_jobs_total", queue="default") == 5
    assert value(first, "hopper_queue_jobs", queue="default", state="scheduled") == 4

    # Paused, the queue's new jobs wait: the depth gauge counts them.
    queues.pause_queue("default")
    scraper.until(lambda s: value(s, "hopper_queue_paused", queue="default") == 1)
    for i in range(3):
        jobs.add.enqueue(i, 1)
    waiting = scraper.until(
        lambda s: value(s, "hopper_queue_jobs", queue="default", state="available") == 3
    )
    assert value(waiting, "hopper_jobs_completed_total", queue="default", kind=ADD) == 3
    assert value(waiting, "hopper_queue_jobs", queue="default", state="running") == 0
    assert value(waiting, "hopper_queue_oldest_available_seconds", queue="default") >= 0

    # Resumed, they run: the counters move on and the depth drops to zero.
    queues.resume_queue("default")
    done = scraper.until(
        lambda s: (
            value(s, "hopper_jobs_completed_total", queue="default", kind=ADD) == 6
            and value(s, "hopper_queue_jobs", queue="default", state="available") == 0
        )
    )
    assert value(done, "hopper_queue_jobs", queue="default", state="scheduled") == 4
    assert value(done, "hopper_worker_busy_slots", queue="default") == 0


@override_settings(ROOT_URLCONF=__name__, HOPPER={"METRICS_TOKEN": "s3cret"})
def test_metrics_view__is_for_staff_or_the_token_only(db):
    jobs.add.enqueue(1, 1)
    client = Client()
    assert client.get("/metrics").status_code == 302  # to the admin's login, like the admin
    user = get_user_model().objects.create_user("op", password="pw", is_staff=False)
    client.force_login(user)
    assert client.get("/metrics").status_code == 302
    user.is_staff = True
    user.save()
    response = client.get("/metrics")
    assert response.status_code == 200
    scraped = samples(response.content.decode())
    assert value(scraped, "hopper_queue_jobs", queue="default", state="available") == 1
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 302
    scraper = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert scraper.status_code == 200


def test_queue_depth__one_query_per_collection_however_many_readers(db):
    depth = metrics.QueueDepth(max_age=60)
    for _ in range(5):
        depth.read()
    assert depth.queries == 1


def test_metrics_sink__counts_each_outcome_by_queue_and_kind():
    class Histograms:
        """What the OpenTelemetry exporter is handed per attempt."""

        def __init__(self) -> None:
            self.durations: list[float] = []
            self.latencies: list[float] = []

        def observe_duration(self, queue: str, kind: str, seconds: float) -> None:
            self.durations.append(seconds)

        def observe_latency(self, queue: str, kind: str, seconds: float) -> None:
            self.latencies.append(seconds)

    from django_hopper.types import JobRow

    now = dt.datetime.now(dt.UTC)
    job = JobRow(
        id=None,  # type: ignore[arg-type]
        kind="k",
        queue="q",
        state="running",
        priority=0,
        attempt=1,
        max_attempts=3,
        scheduled_at=now - dt.timedelta(seconds=2),
        created_at=now - dt.timedelta(seconds=3),
        attempted_at=now,
    )
    numbers, otel = metrics.Aggregate(), Histograms()
    sink = metrics.MetricsSink(numbers, otel)
    sink.started(job)
    sink.finished(job, "retryable", ValueError("x"), 0.5)
    sink.finished(job, "discarded", ValueError("x"), 0.5)
    sink.finished(job, "completed", None, 0.25)
    sink.finished(job, "canceled", None, None)
    sink.ended([JobRow(**{**vars_of(job), "state": "discarded"})])
    sink.rescued([JobRow(**{**vars_of(job), "state": "retryable"})])
    assert numbers.counts() == {
        ("failed", "q", "k"): 2,
        ("retried", "q", "k"): 2,
        ("discarded", "q", "k"): 2,
        ("completed", "q", "k"): 1,
        ("cancelled", "q", "k"): 1,
        ("rescued", "q", "k"): 1,
    }
    assert otel.durations == [0.5, 0.5, 0.25]
    assert otel.latencies == [pytest.approx(2.0)]
    histograms = numbers.histograms()
    duration = histograms[("duration", "q", "k")]
    assert sum(duration[:-1]) == 3 and duration[-1] == pytest.approx(1.25)
    # Prometheus' ``le`` buckets: 0.25 counts in the bucket bounded by 0.25 itself.
    assert duration[metrics.BUCKETS.index(0.25)] == 1
    assert duration[metrics.BUCKETS.index(0.5)] == 2
    assert sum(histograms[("latency", "q", "")][:-1]) == 1


def test_metrics_sink__without_otel_records_nothing_but_the_aggregate():
    numbers = metrics.Aggregate()
    sink = metrics.MetricsSink(numbers)
    from django_hopper.types import JobRow

    now = dt.datetime.now(dt.UTC)
    job = JobRow(
        id=None,  # type: ignore[arg-type]
        kind="k",
        queue="q",
        state="running",
        priority=0,
        attempt=1,
        max_attempts=3,
        scheduled_at=now,
        created_at=now,
        attempted_at=now,
    )
    sink.started(job)
    sink.finished(job, "completed", None, 0.001)
    assert numbers.counts() == {("completed", "q", "k"): 1}


def _row(queue: str = "q", kind: str = "k", waited: float = 0.0) -> Any:
    from django_hopper.types import JobRow

    now = dt.datetime.now(dt.UTC)
    return JobRow(
        id=None,  # type: ignore[arg-type]
        kind=kind,
        queue=queue,
        state="running",
        priority=0,
        attempt=1,
        max_attempts=3,
        scheduled_at=now - dt.timedelta(seconds=waited),
        created_at=now - dt.timedelta(seconds=waited),
        attempted_at=now,
    )


def test_aggregate__a_read_sees_every_attempt_recorded_before_it_by_queue_and_kind():
    numbers = metrics.Aggregate()
    a, b = _row("q", "a", waited=2.0), _row("r", "b")
    for job, state, duration in [
        (a, "completed", 0.25),
        (b, "completed", 0.5),
        (a, "retryable", 2.0),
        (a, "completed", 0.25),
        (b, "discarded", None),  # its start unseen: counted, no duration
    ]:
        numbers.started(job)
        numbers.finished(job, state, None, duration)
    assert numbers.counts() == {
        ("completed", "q", "a"): 2,
        ("failed", "q", "a"): 1,
        ("retried", "q", "a"): 1,
        ("completed", "r", "b"): 1,
        ("failed", "r", "b"): 1,
        ("discarded", "r", "b"): 1,
    }
    histograms = numbers.histograms()
    by_a, by_b = histograms[("duration", "q", "a")], histograms[("duration", "r", "b")]
    assert sum(by_a[:-1]) == 3 and by_a[-1] == pytest.approx(2.5)
    assert by_a[metrics.BUCKETS.index(0.25)] == 2 and by_a[metrics.BUCKETS.index(2.5)] == 1
    assert sum(by_b[:-1]) == 1 and by_b[-1] == pytest.approx(0.5)
    latency = histograms[("latency", "q", "")]
    assert sum(latency[:-1]) == 3 and latency[-1] == pytest.approx(6.0)
    assert latency[metrics.BUCKETS.index(2.5)] == 3
    numbers.finished(a, "completed", None, 0.25)  # recorded after a read: seen by the next
    assert numbers.counts()[("completed", "q", "a")] == 3


def test_aggregate__counts_every_attempt_of_threads_recording_while_it_is_read():
    import threading

    numbers = metrics.Aggregate()
    numbers.FOLD_AT = 64  # the recording threads fold too
    job, per_thread, threads = _row(), 3000, 4
    done = threading.Event()

    def record() -> None:
        for _ in range(per_thread):
            numbers.started(job)
            numbers.finished(job, "completed", None, 0.001)

    def read() -> None:
        while not done.is_set():
            numbers.counts()
            numbers.histograms()

    reader = threading.Thread(target=read)
    reader.start()
    workers = [threading.Thread(target=record) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    reader.join()
    assert numbers.counts() == {("completed", "q", "k"): per_thread * threads}
    histograms = numbers.histograms()
    assert sum(histograms[("duration", "q", "k")][:-1]) == per_thread * threads
    assert sum(histograms[("latency", "q", "")][:-1]) == per_thread * threads


@pytest.mark.parametrize(
    ("setting", "sdk", "expected"),
    [
        (False, True, None),
        ("prometheus", True, "prometheus"),
        ("otel", False, "otel"),
        (None, True, "otel"),
        (None, False, "prometheus"),
        (True, False, "prometheus"),
    ],
)
def test_metrics_exporter__one_per_process_chosen_by_setting_then_sdk(
    setting: Any, sdk: bool, expected: str | None, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(metrics, "otel_configured", lambda: sdk)
    with override_settings(HOPPER={"METRICS": setting}):
        assert metrics.exporter() == expected


def test_prometheus_collector__exposes_the_aggregates_counters_and_histograms(
    monkeypatch: pytest.MonkeyPatch,
):
    numbers = metrics.Aggregate()
    numbers.count("completed", "q", "k", 3)
    numbers.observe("duration", "q", "k", 0.003)
    numbers.observe("latency", "q", "", 2.0)
    monkeypatch.setattr(metrics, "aggregate", numbers)
    monkeypatch.setattr(metrics.depth, "read", lambda: None)
    registry = prometheus_client.CollectorRegistry()
    metrics.PrometheusMetrics(registry)
    scraped = samples(prometheus_client.generate_latest(registry).decode())
    assert value(scraped, "hopper_jobs_completed_total", queue="q", kind="k") == 3
    assert value(scraped, "hopper_job_duration_seconds_count", queue="q", kind="k") == 1
    assert (
        value(scraped, "hopper_job_duration_seconds_bucket", queue="q", kind="k", le="0.001") == 0
    )
    assert (
        value(scraped, "hopper_job_duration_seconds_bucket", queue="q", kind="k", le="0.005") == 1
    )
    assert value(scraped, "hopper_job_pickup_latency_seconds_sum", queue="q") == 2.0


def vars_of(row: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
