"""Run the benchmark: ``python -m bench.run --engine postgres|sqlite|both --scale 1.0``.

Each run measures the raw-SQL bound and hopper in the same process, one after
the other, on the same tables, and prints one table with every hopper figure
beside its bound as a ratio. ``--engine both`` runs each engine in a child
process of its own (Django settings are per process) and merges their JSON.
See docs/benchmark.md for what each figure means.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BASE_DIR / "bench-results"

#: Full-size counts (``--scale 1``); each is multiplied by --scale, with a floor
#: so that a small development run still measures something.
SIZES: dict[str, tuple[int, int]] = {
    # name: (full size, floor)
    "cycle": (20_000, 2_000),
    "insert_one": (5_000, 300),
    "insert_multi": (50_000, 5_000),
    "processing": (20_000, 2_000),
    "waiting_small": (100_000, 1_000),
    "waiting_large": (1_000_000, 10_000),
    "history": (1_000_000, 10_000),
    "memory": (100_000, 5_000),
}
#: The sizes ``--full`` measures whatever the scale: the growth checks at 10^6
#: waiting jobs and 10^6 history rows, and worker memory over 10^5 jobs.
FULL_SIZES = {"waiting_large": 1_000_000, "history": 1_000_000, "memory": 100_000}
#: Jobs of the cold section: 20,000 (as an outside harness measures) at
#: ``--scale`` 0.25 and above, fewer below it, so development runs stay short.
COLD_JOBS = 20_000
LATENCY_JOBS = 200
#: The workflow inserted in one transaction (issue 5; never scaled): one root
#: step, then WORKFLOW_CHAINS chains of WORKFLOW_CHAIN steps after it.
WORKFLOW_CHAINS = 99
WORKFLOW_CHAIN = 101
LATENCY_GAP = 0.020
WORKER_QUEUES = "bench:10"
RESET_TABLES = (
    "hopper_job",
    "hopper_job_history",
    "hopper_job_log",
    "hopper_client",
    "hopper_leader",
    "hopper_job_dependency",
    "hopper_dependency_result",
    "hopper_batch_progress",
    "hopper_batch",
)


#: Alternated off/on pairs of the in-run tracing + metrics figure (its median ratio):
#: even, so that as many pairs start with off as with on.
OBSERVED_PAIRS = 4
#: Alternated pairs of the one-per-transaction enqueue figures (warm and cold)
#: with the raw one-row insert: even, so that as many pairs start with hopper
#: as with the raw insert.
ENQUEUE_PAIRS = 4
ENQUEUE_KEYS = ("enqueue_one_per_tx", "enqueue_one_per_tx_2")
#: The target's tracing + metrics set-up (bench/observe.py, bench/settings.py).
OBSERVED_ENV = {
    "BENCH_OBSERVE": "1",
    "BENCH_OBSERVE_RATIO": "0.1",
    "BENCH_OBSERVE_EXPORTER": "prometheus",
}

#: Processing runs per growth case; the case reports the median (the rounds are in the JSON).
GROWTH_ROUNDS = 3


def size(name: str, scale: float, full_size: bool = False) -> int:
    """Return the count of one workload at this scale (its full size with ``full_size``)."""
    if full_size and name in FULL_SIZES:
        return FULL_SIZES[name]
    full, floor = SIZES[name]
    return max(floor, int(full * scale))


def cold_jobs(scale: float, given: int | None = None) -> int:
    """Return how many jobs the cold section enqueues and works (``--cold-jobs`` if given)."""
    if given:
        return given
    return max(2_000, int(COLD_JOBS * min(1.0, scale * 4)))


# ---------------------------------------------------------------------------
# Child processes


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Return the environment of worker subprocesses: this process's, with bench settings."""
    env = dict(os.environ)
    env.update(extra or {})
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PYTHONPATH"] = str(BASE_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def worker_command(*, burst: bool, queues: str = WORKER_QUEUES) -> list[str]:
    """Return the command line of one ``hopper_worker`` process."""
    cmd = [sys.executable, "-m", "django", "hopper_worker", "--queues", queues]
    if burst:
        cmd.append("--burst")
    return cmd


def read_status(pid: int) -> dict[str, int]:
    """Return VmRSS and VmHWM of a process in kB (empty once it has exited)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def _bench_client(engine: Any) -> int:
    """Register a client with a live lease for a probe (a claim needs one).

    Left to expire: the probes roll back their claims, so it owns nothing,
    and the next measurement's reset truncates it.
    """
    from django_hopper.engine.params import ClientRegisterParams

    return engine.client_register(
        ClientRegisterParams(hostname="bench-probe", ttl=dt.timedelta(hours=6))
    )


class Children:
    """Worker subprocesses, reaped with ``wait4`` so each one's own rusage is read exactly."""

    def __init__(
        self,
        commands: list[list[str]],
        log: Path,
        env: dict[str, str] | None = None,
        *,
        barrier: bool = False,
    ) -> None:
        self.log = open(log, "ab")  # noqa: SIM115 - closed in wait()
        self.started = time.perf_counter()
        self.cpu = 0.0
        self.ended = 0.0
        if not barrier:
            self.procs = [
                subprocess.Popen(
                    cmd,
                    cwd=BASE_DIR,
                    env=worker_env(env),
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                )
                for cmd in commands
            ]
            return
        # bench/barrier.py: every worker sets up, says ready, and waits for ``go``
        # to close; they are released together once all are ready.
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        extra = {**(env or {}), "BENCH_BARRIER": f"{ready_w},{go_r}"}
        try:
            self.procs = [
                subprocess.Popen(
                    cmd,
                    cwd=BASE_DIR,
                    env=worker_env(extra),
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(ready_w, go_r),
                )
                for cmd in commands
            ]
        finally:
            os.close(ready_w)
            os.close(go_r)
        try:
            deadline = time.monotonic() + 300
            ready = 0
            while ready < len(self.procs):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workers never got ready; see {log}")
                if any(p.poll() is not None for p in self.procs):
                    raise RuntimeError(f"a worker exited before it got ready; see {log}")
                if select.select([ready_r], [], [], 0.1)[0]:
                    ready += len(os.read(ready_r, len(self.procs)))
        except BaseException:
            for p in self.procs:
                p.kill()
            raise
        finally:
            os.close(ready_r)
            os.close(go_w)  # the release
        self.started = time.perf_counter()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def signal(self, signum: int) -> None:
        """Send a signal to every child still running."""
        for p in self.procs:
            if p.returncode is None:
                p.send_signal(signum)

    def wait(self, timeout: float = 900.0, tick: Callable[[], None] | None = None) -> float:
        """Reap every child, calling ``tick`` between polls; return their CPU seconds.

        Raises if a child fails or outlives ``timeout`` (after killing it).
        """
        deadline = time.monotonic() + timeout
        pending = list(self.procs)
        while pending:
            for p in list(pending):
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    p.returncode = os.waitstatus_to_exitcode(status)
                    self.cpu += usage.ru_utime + usage.ru_stime
                    pending.remove(p)
            if not pending:
                break
            if time.monotonic() > deadline:
                for p in pending:
                    p.kill()
                raise RuntimeError(f"worker did not finish within {timeout}s; see {self.log.name}")
            if tick is not None:
                tick()
            time.sleep(0.005)
        self.ended = time.perf_counter()
        self.log.close()
        failed = [p.returncode for p in self.procs if p.returncode]
        if failed:
            raise RuntimeError(f"worker exited with {failed}; see {self.log.name}")
        return self.cpu


# ---------------------------------------------------------------------------
# The suite of one engine


class Suite:
    """Every measurement of one engine, on the database bench.settings names."""

    def __init__(self, args: argparse.Namespace) -> None:
        from django.db import connection

        self.args = args
        self.scale: float = args.scale
        self.vendor: str = connection.vendor
        self.engine_name = "postgres" if self.vendor == "postgresql" else "sqlite"
        if self.vendor == "postgresql":
            s = connection.settings_dict
            self.target: Any = {
                "host": s["HOST"], "port": s["PORT"], "user": s["USER"],
                "password": s["PASSWORD"], "dbname": s["NAME"],
            }  # fmt: skip
        else:
            self.target = connection.settings_dict["NAME"]
        self.log = RESULTS_DIR / f"worker-{self.engine_name}.log"
        self.log.write_text("")  # one invocation's worker output, not every run's
        self.startup_cpu = 0.0

    # -- database housekeeping (setup, never measured) ----------------------------

    def sql(self, statement: str, params: list[Any] | None = None) -> None:
        """Run one setup statement on a fresh raw connection, committed."""
        from bench import raw

        if self.vendor == "postgresql":
            with raw.pg_connect(self.target) as conn:
                conn.execute(statement, params)
        else:
            conn = raw.sqlite_connect(self.target)
            conn.execute(statement, params or [])
            conn.close()

    def reset(self) -> None:
        """Empty the tables a measurement touches, so each starts from the same state."""
        from django.db import connections

        connections.close_all()
        if self.vendor == "postgresql":
            self.sql(f"TRUNCATE {', '.join(RESET_TABLES)}")
        else:
            for table in RESET_TABLES:
                self.sql(f"DELETE FROM {table}")

    def seed(
        self,
        *,
        queue: str,
        n: int,
        state: str = "available",
        delay_days: int = 0,
        history: bool = False,
    ) -> None:
        """Insert ``n`` rows in SQL (generate_series / a recursive CTE)."""
        from bench import raw

        if n <= 0:
            return
        statement, params = raw.seed_sql(
            self.vendor, queue=queue, state=state, n=n, delay_days=delay_days, history=history
        )
        self.sql(statement, params)

    def settle(self) -> None:
        """Vacuum and analyze after a large load, as autovacuum would have by then."""
        if self.vendor == "postgresql":
            self.sql("VACUUM ANALYZE hopper_job")
            self.sql("VACUUM ANALYZE hopper_job_history")
        else:
            self.sql("ANALYZE")

    def progress(self, message: str) -> None:
        """Print a progress line (to stderr, so the tables stay clean on stdout)."""
        if not self.args.quiet:
            stamp = time.strftime("%H:%M:%S")
            print(f"  [{stamp} {self.engine_name}] {message}", file=sys.stderr, flush=True)

    # -- 5. the raw-SQL bound -----------------------------------------------------

    def measure_raw(self) -> dict[str, Any]:
        """Measure the claim-and-finalize cycle on 1 and 2 connections, and raw inserts."""
        from bench import raw

        out: dict[str, Any] = {}
        n = size("cycle", self.scale)
        for conns in (1, 2):
            self.reset()
            self.seed(queue=raw.RAW_QUEUE, n=n)
            self.settle()
            self.progress(f"raw cycle, {conns} connection(s), {n:,} jobs")
            done, seconds = raw.run_cycle(self.vendor, self.target, conns)
            out[f"cycle_{conns}conn"] = rate(done, seconds)
            if done != n:
                out[f"cycle_{conns}conn"]["warning"] = f"claimed {done} of {n}"
        self.reset()
        n = size("insert_one", self.scale)
        self.progress(f"raw one-row inserts, {n:,}")
        out["insert_one"] = rate(n, raw.insert_one_by_one(self.vendor, self.target, n))
        self.reset()
        n = size("insert_multi", self.scale)
        self.progress(f"raw multi-row inserts, {n:,}")
        out["insert_multi"] = rate(n, raw.insert_multi_row(self.vendor, self.target, n))
        self.reset()
        return out

    # -- 1. enqueue -----------------------------------------------------------------

    def measure_enqueue(self) -> dict[str, Any]:
        """Measure enqueue through the public API."""
        from django.db import transaction

        import django_hopper
        from bench.jobs import noop

        out: dict[str, Any] = {}
        n = size("insert_one", self.scale)
        self.reset()
        self.progress(f"enqueue() one per transaction, {n:,}, alternated with raw one-row inserts")
        out["one_per_tx"] = self.enqueue_pairs(n, n)

        self.reset()
        self.progress(f"enqueue() with a unique key, one per transaction, {n:,}")
        start = time.perf_counter()
        for i in range(n):
            with transaction.atomic():
                noop.using(unique_key=f"one-{i}").enqueue()
        out["unique_one_per_tx"] = rate(n, time.perf_counter() - start)

        m = size("insert_multi", self.scale)
        batches = [min(1000, m - i) for i in range(0, m, 1000)]
        self.reset()
        self.progress(f"enqueue_many, batches of 1,000, {m:,}")
        start = time.perf_counter()
        for b in batches:
            with transaction.atomic():
                noop.enqueue_many([{}] * b)
        out["many_1000"] = rate(m, time.perf_counter() - start)

        # Per-job unique keys: prepared jobs through django_hopper.enqueue_many,
        # preparing (checking) each job included, as an application pays it.
        self.reset()
        self.progress(f"enqueue_many of prepared jobs with unique keys, 1,000 a call, {m:,}")
        start = time.perf_counter()
        for j, b in enumerate(batches):
            calls = [noop.using(unique_key=f"many-{j}-{i}").prepare() for i in range(b)]
            with transaction.atomic():
                django_hopper.enqueue_many(calls)
        out["unique_many_1000"] = rate(m, time.perf_counter() - start)
        self.reset()
        return out

    def enqueue_pairs(self, n: int, raw_n: int, pairs: int = ENQUEUE_PAIRS) -> dict[str, Any]:
        """Time ``n`` enqueues in ``atomic()`` beside ``raw_n`` raw one-row inserts, alternated.

        The enqueues are ``noop.enqueue()`` inside ``transaction.atomic()``,
        one job per transaction, on Django's connection as it is (the cold
        section's first enqueue is the connection's first statement); the raw
        inserts are :func:`bench.raw.insert_one_by_one`'s, on one connection of
        their own for every pair. A pair is a slice of each, back to back;
        which goes first alternates. A pair's ratio is its enqueue rate over
        its raw rate, and ``ratio`` is the median of the pairs' ratios: the
        bound is measured in the same seconds as hopper, so a commit that
        waits longer for the disk in one window (another process flushing, a
        checkpoint) shows up on both sides, where a bound measured minutes
        apart would not. ``jobs_per_s`` is the enqueues' rate over every pair,
        ``raw_jobs_per_s`` the raw inserts'. The raw rows go to the ``raw``
        queue, which no worker reads.
        """
        from django.db import transaction

        from bench import raw
        from bench.jobs import noop

        def enqueue(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                with transaction.atomic():
                    noop.enqueue()
            return time.perf_counter() - start

        if self.vendor == "postgresql":
            conn: Any = raw.pg_connect(self.target)
        else:
            conn = raw.sqlite_connect(self.target)
        times = {"hopper": 0.0, "raw": 0.0}
        out: list[dict[str, Any]] = []
        try:
            for i in range(pairs):
                k = n // pairs + (1 if i < n % pairs else 0)
                kr = raw_n // pairs + (1 if i < raw_n % pairs else 0)
                order = ("hopper", "raw") if i % 2 == 0 else ("raw", "hopper")
                pair: dict[str, Any] = {"first": order[0]}
                for side in order:
                    if side == "hopper":
                        seconds = enqueue(k)
                        pair["jobs_per_s"] = round(k / seconds, 1)
                    else:
                        seconds = raw.insert_one_by_one(self.vendor, self.target, kr, conn)
                        pair["raw_jobs_per_s"] = round(kr / seconds, 1)
                    times[side] += seconds
                pair["ratio"] = round(pair["jobs_per_s"] / pair["raw_jobs_per_s"], 3)
                out.append(pair)
        finally:
            conn.close()
        result = rate(n, times["hopper"])
        result["raw_jobs_per_s"] = round(raw_n / times["raw"], 1)
        result["ratio"] = round(statistics.median(p["ratio"] for p in out), 3)
        result["pairs"] = out
        return result

    def measure_workflow(self) -> dict[str, Any]:
        """Time a 10,000-job workflow built and inserted in one transaction (issue 5).

        One root step fans out to WORKFLOW_CHAINS chains of WORKFLOW_CHAIN
        steps (10,000 jobs, 9,999 dependency edges), through the public
        ``Workflow`` API, inside ``transaction.atomic()``: ``build_s`` is the
        ``Workflow.add`` calls, ``insert_s`` the ``enqueue()`` and the commit,
        ``seconds`` both. Jobs of a workflow that are waiting on another are
        ``pending``, so no worker could take them meanwhile anyway.
        """
        from django.db import transaction

        from bench.jobs import noop
        from django_hopper import Workflow

        jobs = 1 + WORKFLOW_CHAINS * WORKFLOW_CHAIN
        self.reset()
        self.progress(f"a workflow of {jobs:,} jobs in one transaction")
        start = time.perf_counter()
        with transaction.atomic():
            wf = Workflow("bench")
            root = wf.add(noop, step="root")
            edges = 0
            for _ in range(WORKFLOW_CHAINS):
                prev = root
                for _ in range(WORKFLOW_CHAIN):
                    prev = wf.add(noop, after=[prev])
                    edges += 1
            built = time.perf_counter()
            handle = wf.enqueue()
        end = time.perf_counter()
        out = rate(jobs, end - start)
        out.update(edges=edges, build_s=round(built - start, 4), insert_s=round(end - built, 4))
        if len(handle.jobs) != jobs:
            out["warning"] = f"inserted {len(handle.jobs)} of {jobs} workflow jobs"
        self.reset()
        return out

    # -- 2. processing, 3. latency, 6. memory -------------------------------------------

    def measure_startup(self) -> None:
        """Measure the CPU a burst worker spends with nothing to do (startup and exit); warm up.

        It is subtracted from the CPU of measured runs so that CPU per job is
        the cost of jobs, not of importing Django.
        """
        self.reset()
        kids = Children([worker_command(burst=True)], self.log)
        self.startup_cpu = kids.wait(timeout=120)
        # Warm up once with a long-running worker: the first leader of a fresh database
        # does one-time upkeep (history partitions, analyze), which would otherwise land
        # in the first latency measurement.
        kids = Children([worker_command(burst=False)], self.log)
        time.sleep(5.0)
        kids.signal(signal.SIGTERM)
        kids.wait(timeout=60)
        self.progress(f"idle burst worker: {self.startup_cpu * 1000:.0f} ms CPU (startup+exit)")

    def process(
        self,
        n: int,
        processes: int,
        *,
        memory: bool = False,
        queues: str = WORKER_QUEUES,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Work ``n`` pre-enqueued no-op jobs with ``processes`` burst workers."""
        from django.db import connections
        from django.db.models import Count, Max, Min

        from django_hopper.models import Job, JobHistory

        connections.close_all()
        samples: dict[str, dict[str, int]] = {}
        marks = [0.1, 0.5, 1.0]

        last = [0.0]

        def tick() -> None:
            # Count at most every 100 ms: counting is a query that competes with the worker.
            if not marks or time.monotonic() - last[0] < 0.1:
                return
            last[0] = time.monotonic()
            left = Job.objects.filter(queue="bench").exclude(state="scheduled").count()
            done = 1 - left / n
            while marks and done >= marks[0]:
                status = read_status(kids.pids[0])
                if status:
                    samples[f"{int(marks[0] * 100)}%"] = status
                marks.pop(0)

        self.progress(
            f"{processes} worker process(es), --queues {queues}, {n:,} jobs"
            + (", sampling RSS" if memory else "")
        )
        # Released together once every one has set up (bench/barrier.py), as the
        # raw cycle's processes start behind a barrier.
        kids = Children(
            [worker_command(burst=True, queues=queues) for _ in range(processes)],
            self.log,
            env,
            barrier=True,
        )
        # A burst worker that cannot claim retries forever: bound the wait by the work.
        cpu = kids.wait(timeout=120 + n / 50, tick=tick if memory else None)
        wall = kids.ended - kids.started
        agg = JobHistory.objects.filter(queue="bench").aggregate(
            first=Min("attempted_at"), last=Max("finalized_at"), count=Count("id")
        )
        left = Job.objects.filter(queue="bench").exclude(state="scheduled").count()
        connections.close_all()
        span = (agg["last"] - agg["first"]).total_seconds() if agg["count"] else wall
        out = rate(agg["count"], span)
        net_cpu = max(0.0, cpu - self.startup_cpu * processes)
        out.update(
            processes=processes,
            wall_s=round(wall, 3),
            cpu_s=round(cpu, 3),
            cpu_us_per_job=round(net_cpu / max(1, agg["count"]) * 1e6, 1),
        )
        if agg["count"] != n or left:
            out["warning"] = f"{agg['count']} of {n} jobs in history, {left} left live"
        if memory:
            out["rss_kb"] = {k: v.get("VmRSS") for k, v in samples.items()}
            peaks = [v.get("VmHWM", 0) for v in samples.values()]
            out["peak_rss_kb"] = max(peaks) if peaks else None
        return out

    def latency(self) -> dict[str, Any]:
        """Enqueue jobs one at a time, 20 ms apart, to an idle worker; time each pickup."""
        return summarize_latency([self.latency_samples()])

    def latency_samples(self) -> list[tuple[float, float, float]]:
        """Run one latency probe (LATENCY_JOBS jobs to a worker started for it).

        Return each job's (commit -> start, commit -> claim, claim -> start) in ms.
        """
        from django.db import connections, transaction

        from bench.jobs import stamp
        from django_hopper.models import Client, JobHistory

        connections.close_all()
        kids = Children([worker_command(burst=False)], self.log)
        try:
            deadline = time.monotonic() + 60
            while not Client.objects.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker never registered; see {self.log}")
                time.sleep(0.05)
            time.sleep(1.0)  # let it finish starting: listener, first poll
            self.progress(f"pickup latency, {LATENCY_JOBS} jobs {LATENCY_GAP * 1000:.0f} ms apart")
            committed: dict[Any, float] = {}
            for _ in range(LATENCY_JOBS):
                started = time.perf_counter()
                with transaction.atomic():
                    handle = stamp.enqueue()
                committed[handle.id] = time.time()
                time.sleep(max(0.0, LATENCY_GAP - (time.perf_counter() - started)))
            deadline = time.monotonic() + 60
            rows: list[tuple[Any, Any, Any]] = []
            while time.monotonic() < deadline:
                rows = list(
                    JobHistory.objects.filter(id__in=list(committed)).values_list(
                        "id", "output", "attempted_at"
                    )
                )
                if len(rows) == len(committed):
                    break
                time.sleep(0.1)
        finally:
            kids.signal(signal.SIGTERM)
            kids.wait(timeout=60)
            connections.close_all()
        # attempted_at is the claim's clock (PostgreSQL's now() at the claim statement, the
        # worker's clock on SQLite; one machine, one clock): it splits the latency into
        # commit -> claim (notification, wake-up) and claim -> start (claim, handoff).
        return [
            (
                (float(out) - committed[jid]) * 1000,
                (at.timestamp() - committed[jid]) * 1000,
                (float(out) - at.timestamp()) * 1000,
            )
            for jid, out, at in rows
        ]

    # -- 7. cold: the way a user first sees it --------------------------------------

    def measure_cold(self) -> dict[str, Any]:
        """Enqueue and work jobs on a fresh database, with no warm-up, as a user would.

        For one worker process, then two: the database is created anew; the
        jobs are enqueued through the public API, ``.enqueue()`` inside
        ``transaction.atomic()`` one per transaction (timed: the cold enqueue
        rate); then ``hopper_worker`` processes start, not in burst mode (the
        leader's start-up upkeep runs as it would), and are stopped once
        history holds every job. Throughput = jobs / (last ``finalized_at`` -
        first ``attempted_at``), read from history. Nothing is vacuumed or
        analyzed meanwhile. Pickup latency is then measured on that database
        (its history full, its live table churned) with a worker that starts
        for it.
        """
        from django.db import connections

        n = cold_jobs(self.scale, self.args.cold_jobs)
        raw_n = size("insert_one", self.scale)
        out: dict[str, Any] = {"jobs": n}
        for processes in (1, 2):
            connections.close_all()
            prepare_database()
            connections.close_all()
            self.progress(
                f"cold: enqueue() one per transaction, {n:,} jobs, fresh database, "
                f"alternated with {raw_n:,} raw one-row inserts"
            )
            key = "enqueue_one_per_tx" if processes == 1 else "enqueue_one_per_tx_2"
            out[key] = self.enqueue_pairs(n, raw_n)
            out[f"{processes}proc"] = self.process_until_done(n, processes)
        out["latency"] = self.latency()
        connections.close_all()
        return out

    def process_until_done(self, n: int, processes: int) -> dict[str, Any]:
        """Start ``processes`` long-running workers; stop them once history holds ``n`` jobs."""
        from django.db import connections
        from django.db.models import Count, Max, Min

        from django_hopper.models import Job, JobHistory

        self.progress(f"cold: {processes} worker process(es) (not burst), {n:,} jobs")
        connections.close_all()
        kids = Children([worker_command(burst=False) for _ in range(processes)], self.log)
        deadline = time.monotonic() + 120 + n / 50
        try:
            while time.monotonic() < deadline:
                # One index probe every 100 ms: no live job left means every job
                # was finalized (moved to history) by the workers.
                time.sleep(0.1)
                if not Job.objects.filter(queue="bench").exists():
                    break
                if any(p.poll() is not None for p in kids.procs):
                    break
        finally:
            kids.signal(signal.SIGTERM)
            cpu = kids.wait(timeout=60)
        agg = JobHistory.objects.filter(queue="bench").aggregate(
            first=Min("attempted_at"), last=Max("finalized_at"), count=Count("id")
        )
        connections.close_all()
        span = (agg["last"] - agg["first"]).total_seconds() if agg["count"] else 0.0
        out = rate(agg["count"], span)
        out.update(processes=processes, cpu_s=round(cpu, 3))
        out["cpu_us_per_job"] = round(cpu / max(1, agg["count"]) * 1e6, 1)
        if agg["count"] != n:
            out["warning"] = f"{agg['count']} of {n} jobs in history"
        return out

    # -- 4. cost as the work grows --------------------------------------------------

    def growth_case(self, label: str, filler: int, history: int) -> dict[str, Any]:
        """Measure throughput and latency with ``filler`` waiting jobs and ``history`` rows.

        Half the waiting jobs are available in another queue, half scheduled
        a day ahead in the benchmark's own queue: the claim must step over
        neither. History rows sit in another queue.
        """
        self.reset()
        if filler or history:
            self.progress(f"{label}: loading {filler:,} waiting jobs, {history:,} history rows")
        self.seed(queue="other", n=filler // 2)
        self.seed(queue="bench", n=filler - filler // 2, state="scheduled", delay_days=1)
        self.seed(queue="old", n=history, state="completed", history=True)
        n = size("processing", self.scale)
        self.seed(queue="bench", n=n)
        self.settle()
        claim, finalize = self.claim_probe(), self.finalize_probe()
        # One processing run of a few thousand jobs lasts a fraction of a second, so
        # one slow round on a shared machine decided the flatness figure: run the
        # same load GROWTH_ROUNDS times (the processed jobs removed from history
        # between rounds, so every round sees the same tables) and keep the median.
        # Pickup latency is probed after each round the same way and its figures are
        # those of every probed job together (GROWTH_ROUNDS x LATENCY_JOBS): one
        # probe of 200 jobs, minutes away from the empty case's, moved the ratio by
        # half either way on a shared machine.
        rounds = [self.process(n, 1)]
        probes = [self.latency_samples()]
        for _ in range(GROWTH_ROUNDS - 1):
            self.sql("DELETE FROM hopper_job_history WHERE queue = 'bench'")
            self.seed(queue="bench", n=n)
            self.settle()
            rounds.append(self.process(n, 1))
            probes.append(self.latency_samples())
        processing = dict(sorted(rounds, key=lambda r: r["jobs_per_s"])[len(rounds) // 2])
        processing["rounds_jobs_per_s"] = [r["jobs_per_s"] for r in rounds]
        return {
            "waiting": filler,
            "history": history,
            "claim": claim,
            "finalize": finalize,
            "processing": processing,
            "latency": summarize_latency(probes),
        }

    def claim_probe(self, rounds: int = 25) -> dict[str, Any]:
        """Time hopper's claim of 10 jobs by itself (rolled back each time), and its plan.

        Isolates the claim from the worker: if it slows down as the tables
        grow, this shows it before any throughput figure does. The plan is
        taken of the statement the engine actually sent (captured with an
        execute wrapper), so it follows the engine's SQL as that changes.
        """
        from django.db import connection, connections, transaction

        from django_hopper.engine import get_engine
        from django_hopper.engine.params import JobClaimParams

        engine = get_engine()
        params = JobClaimParams(queue="bench", client_id=_bench_client(engine), limit=10)
        sent: list[tuple[str, Any]] = []

        def capture(execute: Any, sql: str, values: Any, many: bool, context: Any) -> Any:
            sent.append((sql, values))
            return execute(sql, values, many, context)

        times = []
        claimed = 0
        try:
            for i in range(rounds):
                with transaction.atomic():
                    start = time.perf_counter()
                    if i == 0:
                        with connection.execute_wrapper(capture):
                            claimed = len(engine.job_claim(params).jobs)
                    else:
                        claimed = len(engine.job_claim(params).jobs)
                    times.append((time.perf_counter() - start) * 1000)
                    transaction.set_rollback(True)
        except Exception as exc:  # an engine in flux must not sink the whole run
            connections.close_all()
            return {"warning": f"claim probe failed: {exc}"}
        out: dict[str, Any] = {"median_ms": round(statistics.median(times), 3), "claimed": claimed}
        if self.vendor == "postgresql" and sent:
            sql, values = max(sent, key=lambda sv: len(sv[0]))  # the claim, not a helper read
            try:
                with transaction.atomic(), connection.cursor() as cur:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, values)
                    plan = [row[0] for row in cur.fetchall()]
                    transaction.set_rollback(True)
                out["plan"] = plan
                for line in plan:
                    if line.startswith(("Planning Time", "Execution Time")):
                        key = "planning_ms" if line.startswith("Planning") else "execution_ms"
                        out[key] = float(line.split(":")[1].split()[0])
            except Exception as exc:
                out["plan_error"] = str(exc)
        connections.close_all()
        return out

    def keyed_claim_probe(self, hot: int = 10_000, keys: int = 1_000) -> dict[str, Any]:
        """Time claims of a queue whose window is full of one key's blocked jobs.

        ``hot`` jobs wait behind one ordering key's head and ``keys`` other keys
        have one job each, so the claim falls back to walking the keys: its cost
        must follow the keys, never the jobs blocked behind a head. One claim of
        50 and five of 10 are timed in a transaction that is rolled back.
        """
        from django.db import connections, transaction

        from django_hopper.engine import get_engine
        from django_hopper.engine.params import JobClaimParams, JobInsertParams

        engine = get_engine()
        client_id = _bench_client(engine)
        params = [JobInsertParams(kind="bench.jobs.noop", queue="keyed", ordering_key="hot")] * hot
        params += [
            JobInsertParams(kind="bench.jobs.noop", queue="keyed", ordering_key=f"k{i:05}")
            for i in range(keys)
        ]
        try:
            with transaction.atomic():
                for start in range(0, len(params), 2_000):
                    engine.job_insert_many(params[start : start + 2_000])
                started = time.perf_counter()
                first = engine.job_claim(
                    JobClaimParams(queue="keyed", client_id=client_id, limit=50)
                )
                first_ms = (time.perf_counter() - started) * 1000
                started = time.perf_counter()
                for _ in range(5):
                    engine.job_claim(JobClaimParams(queue="keyed", client_id=client_id, limit=10))
                each_ms = (time.perf_counter() - started) * 1000 / 5
                transaction.set_rollback(True)
        except Exception as exc:  # an engine in flux must not sink the whole run
            connections.close_all()
            return {"warning": f"keyed claim probe failed: {exc}"}
        connections.close_all()
        return {
            "blocked": hot,
            "keys": keys,
            "claimed": len(first.jobs),
            "first_ms": round(first_ms, 2),
            "each_ms": round(each_ms, 2),
        }

    def finalize_probe(self, rounds: int = 15) -> dict[str, Any]:
        """Time hopper's finalize of 10 claimed jobs by itself (rolled back), and its plan.

        Each round claims 10 jobs and completes them with ``job_finalize_many``
        in one transaction that is then rolled back; only the finalize is
        timed. On PostgreSQL the first round runs the statement the engine
        sends under ``EXPLAIN (ANALYZE, BUFFERS)`` instead, for its planning
        and execution times.
        """
        from django.db import connection, connections, transaction

        from django_hopper.engine import get_engine
        from django_hopper.engine.params import JobClaimParams, JobFinalize, JobFinalizeParams

        engine = get_engine()
        claim_params = JobClaimParams(queue="bench", client_id=_bench_client(engine), limit=10)
        plan: list[str] = []

        def explain(execute: Any, sql: str, values: Any, many: bool, context: Any) -> Any:
            if not plan and "hopper_job_history" in sql and "INSERT" in sql.upper():
                plan.extend(
                    row[0]
                    for row in execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, values, many, context)
                    or context["cursor"].fetchall()
                )
            return execute(sql, values, many, context)

        times = []
        try:
            for i in range(rounds):
                with transaction.atomic():
                    jobs = engine.job_claim(claim_params)
                    results = [
                        JobFinalize(
                            id=j.id, attempted_by=j.attempted_by, fence=j.fence, state="completed"
                        )
                        for j in jobs.jobs
                    ]
                    params = JobFinalizeParams(jobs=results, no_batches=True)
                    if i == 0 and self.vendor == "postgresql":
                        with connection.execute_wrapper(explain):
                            engine.job_finalize_many(params)
                    else:
                        start = time.perf_counter()
                        engine.job_finalize_many(params)
                        times.append((time.perf_counter() - start) * 1000)
                    transaction.set_rollback(True)
        except Exception as exc:  # an engine in flux must not sink the whole run
            connections.close_all()
            return {"warning": f"finalize probe failed: {exc}"}
        out: dict[str, Any] = {"median_ms": round(statistics.median(times), 3) if times else None}
        for line in plan:
            if line.startswith(("Planning Time", "Execution Time")):
                key = "planning_ms" if line.startswith("Planning") else "execution_ms"
                out[key] = float(line.split(":")[1].split()[0])
        if plan:
            out["plan"] = plan
        connections.close_all()
        return out

    # -- one run -------------------------------------------------------------------------

    def run_growth(self) -> dict[str, Any]:
        """Run only the growth cases and the memory run (``--growth-only``), e.g. with ``--full``.

        The flatness figures compare each case to the empty case of the same
        run, so they need no raw bound.
        """
        self.measure_startup()
        cases: dict[str, Any] = {"empty": self.growth_case("empty", 0, 0)}
        large = size("waiting_large", self.scale, self.args.full)
        cases["waiting_large"] = self.growth_case(f"{large:,} waiting", large, 0)
        hist = size("history", self.scale, self.args.full)
        cases["history_large"] = self.growth_case(f"{hist:,} in history", 0, hist)
        m = size("memory", self.scale, self.args.full)
        self.reset()
        self.seed(queue="bench", n=m)
        self.settle()
        result: dict[str, Any] = {"growth": cases, "memory": self.process(m, 1, memory=True)}
        self.reset()
        base = cases["empty"]
        ratios: dict[str, Any] = {}
        for key in ("waiting_large", "history_large"):
            c = cases[key]
            tp, btp = c["processing"]["jobs_per_s"], base["processing"]["jobs_per_s"]
            med, bmed = c["latency"].get("median_ms"), base["latency"].get("median_ms")
            ratios[f"{key}_throughput"] = round(tp / btp, 3) if tp and btp else None
            ratios[f"{key}_latency"] = round(med / bmed, 3) if med and bmed else None
        result["ratios"] = ratios
        return result

    def run_once(self) -> dict[str, Any]:
        """Run every section once; return the results."""
        if self.args.growth_only:
            return self.run_growth()
        result: dict[str, Any] = {}
        if self.args.cold:
            # First, on a database created for it: nothing has run on it yet.
            result["cold"] = self.measure_cold()
        result["raw"] = self.measure_raw()
        result["enqueue"] = self.measure_enqueue()
        if self.vendor == "postgresql":
            from bench import roundtrips

            result["round_trips"] = {
                label: {"round_trips": c["round_trips"], "statements": c["statements"]}
                for label, c in roundtrips.measure().items()
            }
            self.reset()
        result["workflow"] = self.measure_workflow()
        self.measure_startup()
        result["startup_cpu_s"] = round(self.startup_cpu, 3)
        cases: dict[str, Any] = {}
        cases["empty"] = self.growth_case("empty", 0, 0)
        n = size("processing", self.scale)
        self.reset()
        self.seed(queue="bench", n=n)
        self.settle()
        result["processing"] = {"1proc": cases["empty"]["processing"], "2proc": self.process(n, 2)}
        # A diagnostic, not a target: concurrency 100 lets one claim take up to 100 jobs,
        # as the raw cycle does, which shows what the claim batch size costs at 10.
        self.reset()
        self.seed(queue="bench", n=n)
        self.settle()
        result["processing"]["1proc_c100"] = self.process(n, 1, queues="bench:100")
        # The same work with OpenTelemetry tracing and metrics on as
        # docs/observability.md recommends (bench/observe.py: parent-based
        # sampling of a tenth of new traces, the Prometheus exporter), as a
        # ratio to off measured beside it: the median of alternated off/on
        # pairs (measure_observed); --observe adds every trace sampled and
        # the OpenTelemetry exporter.
        result["processing"]["1proc_observed"] = self.measure_observed(n)
        result["latency"] = cases["empty"]["latency"]
        small = size("waiting_small", self.scale)
        large = size("waiting_large", self.scale, self.args.full)
        cases["waiting_small"] = self.growth_case(f"{small:,} waiting", small, 0)
        cases["waiting_large"] = self.growth_case(f"{large:,} waiting", large, 0)
        hist = size("history", self.scale, self.args.full)
        cases["history_large"] = self.growth_case(f"{hist:,} in history", 0, hist)
        result["growth"] = cases
        self.reset()
        result["keyed_claim"] = self.keyed_claim_probe()
        m = size("memory", self.scale, self.args.full)
        self.reset()
        self.seed(queue="bench", n=m)
        self.settle()
        result["memory"] = self.process(m, 1, memory=True)
        self.reset()
        result["ratios"] = ratios(result)
        return result

    def measure_observed(self, n: int, pairs: int = OBSERVED_PAIRS) -> dict[str, Any]:
        """Work ``n`` jobs off and with the target's set-up on, in ``pairs`` alternated pairs.

        A pair is one off run and one on run back to back, a few seconds
        apart; which goes first alternates (off first in the first pair, on
        first in the second, ...), so that neither side always meets the
        machine first. A pair's ratio is on / off; the figure (``ratio``) is
        the median of the pairs' ratios (of four: the mean of the middle
        two, as many of them off first as on first, so a bias from going
        first does not decide it), and ``jobs_per_s`` and
        ``cpu_us_per_job`` are the on runs' medians (``off_*`` the off runs'),
        so that one slow run moves the figure no more than one pair's worth.
        The on runs' CPU per job is net of what the set-up adds to an idle
        worker's start-up (importing the SDK, its threads), as ``--observe``'s.
        """
        self.reset()
        idle = Children([worker_command(burst=True)], self.log, OBSERVED_ENV).wait(120)
        extra_startup = max(0.0, idle - self.startup_cpu)
        out: list[dict[str, Any]] = []
        for i in range(pairs):
            order = ("off", "on") if i % 2 == 0 else ("on", "off")
            pair: dict[str, Any] = {"first": order[0]}
            for side in order:
                self.reset()
                self.seed(queue="bench", n=n)
                self.settle()
                self.progress(f"tracing + metrics pair {i + 1} of {pairs}: {side}")
                pair[side] = self.process(n, 1, env=OBSERVED_ENV if side == "on" else None)
                if side == "on":
                    pair[side]["cpu_us_per_job"] = round(
                        pair[side]["cpu_us_per_job"] - extra_startup / max(1, n) * 1e6, 1
                    )
            on, off = pair["on"]["jobs_per_s"], pair["off"]["jobs_per_s"]
            pair["ratio"] = round(on / off, 3) if on and off else None
            out.append(pair)

        def median_of(side: str, key: str) -> float | None:
            values = [p[side][key] for p in out if p[side].get(key) is not None]
            return statistics.median(values) if values else None

        ratios = [p["ratio"] for p in out if p["ratio"] is not None]
        return {
            "jobs": n,
            "jobs_per_s": median_of("on", "jobs_per_s"),
            "cpu_us_per_job": median_of("on", "cpu_us_per_job"),
            "off_jobs_per_s": median_of("off", "jobs_per_s"),
            "off_cpu_us_per_job": median_of("off", "cpu_us_per_job"),
            "ratio": round(statistics.median(ratios), 3) if ratios else None,
            "startup_cpu_s_on": round(idle, 3),
            "pairs": out,
        }

    def measure_pgbouncer(self) -> dict[str, Any]:
        """Work the processing load directly, then through PgBouncer in each pool mode.

        Workers through a transaction pooler prepare no statements and LISTEN
        over the direct connection, as docs/deploying.md advises; the ratio
        to direct is what the bouncer costs (an extra hop per statement, and
        unprepared hot statements in transaction mode). ``direct_unprepared``
        (direct, ``PREPARED_STATEMENTS`` off) separates the two costs.
        """
        import tempfile

        from tests.pgbouncer import Bouncer

        n = size("processing", self.scale)
        out: dict[str, Any] = {}

        def work(label: str) -> None:
            for procs in (1, 2):
                self.reset()
                self.seed(queue="bench", n=n)
                self.settle()
                out[f"{label}_{procs}proc"] = self.process(n, procs)

        work("direct")
        # What a transaction pooler takes away on its own: the prepared statements.
        os.environ["BENCH_PREPARED_STATEMENTS"] = "0"
        try:
            work("direct_unprepared")
        finally:
            del os.environ["BENCH_PREPARED_STATEMENTS"]
        for mode in ("transaction", "session"):
            bouncer = Bouncer(
                Path(tempfile.mkdtemp(prefix="hopper-bench-pgbouncer-")),
                mode,
                server_host=str(self.target["host"]),
                server_port=int(self.target["port"]),
                user=str(self.target["user"]),
            )
            os.environ["BENCH_PGBOUNCER_PORT"] = str(bouncer.start())
            os.environ["BENCH_PGBOUNCER_MODE"] = mode
            try:
                work(mode)
            finally:
                del os.environ["BENCH_PGBOUNCER_PORT"], os.environ["BENCH_PGBOUNCER_MODE"]
                bouncer.stop()
        for mode in ("direct_unprepared", "transaction", "session"):
            for procs in (1, 2):
                bounced = out[f"{mode}_{procs}proc"]["jobs_per_s"]
                direct = out[f"direct_{procs}proc"]["jobs_per_s"]
                out[f"ratio_{mode}_{procs}proc"] = round(bounced / direct, 3) if direct else None
        return out

    def measure_observe(self, rounds: int = 3, only: Sequence[str] = ()) -> dict[str, Any]:
        """Work the processing load with tracing and metrics off and on, alternating.

        Each round works the same jobs once per set-up, back to back (in
        reverse order every other round), so that every ratio compares runs a
        few seconds apart on the same machine (whose load may change between
        rounds): off; tracing and metrics on
        with every job sampled (metrics through OpenTelemetry); with
        parent-based sampling of a tenth of the traces; and that with the
        Prometheus exporter, the set-up docs/observability.md recommends. The median
        of each set-up's per-round ratios is the figure; CPU µs per job is the
        load-independent one. ``only`` names the set-ups to run beside off (all
        by default).
        """
        n = size("processing", self.scale)
        setups: dict[str, dict[str, str]] = {
            "off": {},
            "on_sampled_all": {"BENCH_OBSERVE": "1", "BENCH_OBSERVE_RATIO": "1"},
            "on_sampled_0.1": {"BENCH_OBSERVE": "1", "BENCH_OBSERVE_RATIO": "0.1"},
            "on_sampled_0.1_prometheus": {
                "BENCH_OBSERVE": "1",
                "BENCH_OBSERVE_RATIO": "0.1",
                "BENCH_OBSERVE_EXPORTER": "prometheus",
            },
        }
        if only:
            setups = {name: env for name, env in setups.items() if name == "off" or name in only}
        out: dict[str, Any] = {"rounds": []}
        # What each set-up costs a worker that does nothing (importing Django
        # and the SDK, its threads, exit), beyond the idle worker process()
        # subtracts: taken off too, so that CPU per job is what the jobs cost.
        # The least of three, alternated: one idle run moves by 0.1-0.2 s on a
        # loaded machine, which is 50-100 µs per job of a 2,000-job run.
        startup: dict[str, float] = {}
        for _ in range(3):
            for name, env in setups.items():
                self.reset()
                idle = Children([worker_command(burst=True)], self.log, env).wait(120)
                startup[name] = min(startup.get(name, idle), idle)
        out["startup_cpu_s"] = {name: round(cpu, 3) for name, cpu in startup.items()}
        for i in range(rounds):
            row: dict[str, Any] = {}
            # Every other round runs the set-ups in reverse order, off last:
            # no set-up always meets the machine first.
            ordered = list(setups.items())
            for name, env in ordered if i % 2 == 0 else reversed(ordered):
                self.reset()
                self.seed(queue="bench", n=n)
                self.settle()
                self.progress(f"observe round {i + 1} of {rounds}: {name}")
                row[name] = self.process(n, 1, env=env)
                extra = max(0.0, startup[name] - self.startup_cpu)
                row[name]["cpu_us_per_job"] = round(
                    row[name]["cpu_us_per_job"] - extra / max(1, n) * 1e6, 1
                )
            off = row["off"]["jobs_per_s"]
            for name in setups:
                if name != "off":
                    on = row[name]["jobs_per_s"]
                    row[f"ratio_{name}"] = round(on / off, 3) if on and off else None
                    row[f"extra_cpu_us_{name}"] = round(
                        row[name]["cpu_us_per_job"] - row["off"]["cpu_us_per_job"], 1
                    )
            out["rounds"].append(row)
        for key in out["rounds"][0]:
            if key.startswith(("ratio_", "extra_cpu_us_")):
                values = [r[key] for r in out["rounds"] if r[key] is not None]
                out[key] = statistics.median(values) if values else None
        for name in setups:
            out[f"cpu_us_per_job_{name}"] = statistics.median(
                r[name]["cpu_us_per_job"] for r in out["rounds"]
            )
        return out

    def profile(self, path: Path) -> dict[str, Any]:
        """Run one burst worker under py-spy (raw collapsed stacks) and summarize it."""
        import shutil

        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            return {"error": "py-spy is not installed (pip install py-spy)"}
        n = size("processing", self.scale)
        self.reset()
        self.seed(queue="bench", n=n)
        self.settle()
        self.progress(f"profiling one worker over {n:,} jobs with py-spy -> {path}")
        cmd = [
            spy,
            "record",
            "--format",
            "raw",
            "--threads",
            "--idle",
            "--rate",
            "100",
            "--output",
            str(path),
            "--",
            *worker_command(burst=True),
        ]
        Children([cmd], self.log).wait()
        from bench.profile import summarize

        return summarize(path)


def ratios(r: dict[str, Any]) -> dict[str, float | None]:
    """Return every hopper figure of one run as a ratio to its bound in the same run.

    Stored with the run so that several runs are summarized by the median of
    their ratios (each ratio from one run), not by a ratio of medians.
    """

    def div(a: Any, b: Any) -> float | None:
        return round(a / b, 3) if a and b else None

    raw, enq, proc, growth = r["raw"], r["enqueue"], r["processing"], r["growth"]
    one, two = raw["cycle_1conn"]["jobs_per_s"], raw["cycle_2conn"]["jobs_per_s"]
    out = {
        "processing_1proc": div(proc["1proc"]["jobs_per_s"], one),
        "processing_2proc": div(proc["2proc"]["jobs_per_s"], two),
        "processing_1proc_c100": div(proc["1proc_c100"]["jobs_per_s"], one),
        "processing_observed": observed_ratio(proc),
        # The median of the pairs alternated with the raw insert; a run written
        # before the pairs is read against the run's raw insert figure, as it was.
        "enqueue_one_per_tx": enq["one_per_tx"].get("ratio")
        or div(enq["one_per_tx"]["jobs_per_s"], raw["insert_one"]["jobs_per_s"]),
        "enqueue_unique_one_per_tx": div(
            enq["unique_one_per_tx"]["jobs_per_s"], raw["insert_one"]["jobs_per_s"]
        ),
        "enqueue_many_1000": div(enq["many_1000"]["jobs_per_s"], raw["insert_multi"]["jobs_per_s"]),
        "insert_many_unique_1000": div(
            enq["unique_many_1000"]["jobs_per_s"], raw["insert_multi"]["jobs_per_s"]
        ),
    }
    base = growth["empty"]
    for key in ("waiting_small", "waiting_large", "history_large"):
        out[f"{key}_throughput"] = div(
            growth[key]["processing"]["jobs_per_s"], base["processing"]["jobs_per_s"]
        )
        out[f"{key}_latency"] = div(
            growth[key]["latency"].get("median_ms"), base["latency"].get("median_ms")
        )
    cold = r.get("cold")
    if cold:
        out["cold_1proc"] = div(cold["1proc"]["jobs_per_s"], one)
        out["cold_2proc"] = div(cold["2proc"]["jobs_per_s"], two)
        out["cold_enqueue_one_per_tx"] = cold["enqueue_one_per_tx"].get("ratio") or div(
            cold["enqueue_one_per_tx"]["jobs_per_s"], raw["insert_one"]["jobs_per_s"]
        )
    return out


def observed_ratio(proc: dict[str, Any]) -> float | None:
    """Return the in-run ratio of tracing + metrics on to off.

    The median of the alternated pairs' ratios; a run written before the
    pairs (one on run) is read against the run's 1-process figure, as it
    was then.
    """
    observed = proc.get("1proc_observed") or {}
    if "ratio" in observed:
        return observed["ratio"]  # type: ignore[no-any-return]
    on, off = observed.get("jobs_per_s"), proc["1proc"]["jobs_per_s"]
    return round(on / off, 3) if on and off else None


#: The targets of the benchmark: (label, engines, how to read the figure, test).
#: A figure is read from one run's tree (or the tree of medians; its ratios are
#: the medians of the runs' ratios).
Target = tuple[str, tuple[str, ...], Callable[[dict[str, Any]], Any], Callable[[Any], bool]]
PG, BOTH = ("postgres",), ("postgres", "sqlite")


def _ratio_of(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda r: (r.get("ratios") or {}).get(key)


def _rss_growth_mb(r: dict[str, Any]) -> float | None:
    rss = r["memory"].get("rss_kb") or {}
    if rss.get("10%") is None or rss.get("100%") is None:
        return None
    return float((rss["100%"] - rss["10%"]) / 1024)


def _lat(section: str, key: str) -> Callable[[dict[str, Any]], Any]:
    def read(r: dict[str, Any]) -> Any:
        tree = r.get("cold") if section == "cold" else r
        return ((tree or {}).get("latency") or {}).get(key)

    return read


def _round_trips(label: str) -> Callable[[dict[str, Any]], Any]:
    return lambda r: ((r.get("round_trips") or {}).get(label) or {}).get("round_trips")


TARGETS: list[Target] = [
    ("1 process, c10 >= 0.50 x raw (1 conn), warm", PG, _ratio_of("processing_1proc"),
     lambda v: v >= 0.50),
    ("1 process, c10 >= 0.50 x raw (1 conn), cold", PG, _ratio_of("cold_1proc"),
     lambda v: v >= 0.50),
    ("2 processes >= 0.50 x raw (2 conns), warm", PG, _ratio_of("processing_2proc"),
     lambda v: v >= 0.50),
    ("2 processes >= 0.50 x raw (2 conns), cold", PG, _ratio_of("cold_2proc"),
     lambda v: v >= 0.50),
    ("SQLite 1 process >= 0.40 x raw", ("sqlite",), _ratio_of("processing_1proc"),
     lambda v: v >= 0.40),
    ("SQLite 1 process, cold >= 0.40 x raw", ("sqlite",), _ratio_of("cold_1proc"),
     lambda v: v >= 0.40),
    ("enqueue() in atomic() >= 0.60 x one-row insert, warm", BOTH,
     _ratio_of("enqueue_one_per_tx"), lambda v: v >= 0.60),
    ("enqueue() in atomic() >= 0.60 x one-row insert, cold", BOTH,
     _ratio_of("cold_enqueue_one_per_tx"), lambda v: v >= 0.60),
    ("enqueue() in autocommit: 1 round trip", PG, _round_trips("enqueue() in autocommit"),
     lambda v: v <= 1),
    ("enqueue() in atomic(): 1 statement of its own", PG,
     lambda r: (_round_trips("two enqueue() in one atomic()")(r) or 0)
     - (_round_trips("enqueue() in transaction.atomic()")(r) or 0) or None,
     lambda v: v <= 1),
    ("pickup median <= 1.5 ms, warm", PG, _lat("warm", "median_ms"), lambda v: v <= 1.5),
    ("pickup p95 <= 2.5 ms, warm", PG, _lat("warm", "p95_ms"), lambda v: v <= 2.5),
    ("pickup median <= 1.5 ms, cold", PG, _lat("cold", "median_ms"), lambda v: v <= 1.5),
    ("pickup p95 <= 2.5 ms, cold", PG, _lat("cold", "p95_ms"), lambda v: v <= 2.5),
    ("flat: large waiting, throughput >= 0.90 x empty", BOTH,
     _ratio_of("waiting_large_throughput"), lambda v: v >= 0.90),
    ("flat: large waiting, latency <= 1.10 x empty", PG,
     _ratio_of("waiting_large_latency"), lambda v: v <= 1.10),
    ("flat: large history, throughput >= 0.90 x empty", BOTH,
     _ratio_of("history_large_throughput"), lambda v: v >= 0.90),
    ("flat: large history, latency <= 1.10 x empty", PG,
     _ratio_of("history_large_latency"), lambda v: v <= 1.10),
    ("worker RSS flat (10% -> 100%: <= 3 MB)", BOTH, _rss_growth_mb, lambda v: v <= 3.0),
    ("tracing (parent-based 0.1) + metrics on >= 0.90 x off", BOTH,
     _ratio_of("processing_observed"), lambda v: v >= 0.90),
]  # fmt: skip


def evaluate_targets(engine: str, r: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """Return each target that applies to ``engine``: its label, figure, and met / missed."""
    out = []
    for label, engines, read, test in TARGETS:
        if engine not in engines:
            continue
        try:
            value = read(r)
        except (KeyError, TypeError):
            value = None
        verdict = "not measured" if value is None else ("met" if test(value) else "missed")
        out.append((label, value, verdict))
    return out


def render_targets(engine: str, r: dict[str, Any]) -> list[str]:
    """Return the lines of the targets table: each target, its figure, met or missed."""
    lines = ["Targets (ratios to the raw bound of the same run)"]
    for label, value, verdict in evaluate_targets(engine, r):
        shown = "n/a" if value is None else f"{value:.2f}"
        lines.append(f"  {label:<56} {shown:>6}  {verdict}")
    return lines


def summarize_latency(probes: list[list[tuple[float, float, float]]]) -> dict[str, Any]:
    """Return the pickup figures of one or more probes, their jobs taken together.

    Each probe is a list of (commit -> start, commit -> claim, claim -> start) in
    ms, one per job; with several probes the JSON also has each one's median.
    """
    rows = [row for probe in probes for row in probe]
    if not rows:
        return {"jobs": 0, "warning": "no job ran"}
    lat = sorted(r[0] for r in rows)
    result: dict[str, Any] = {
        "jobs": len(lat),
        "median_ms": round(statistics.median(lat), 2),
        "p95_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.95))], 2),
        "max_ms": round(lat[-1], 2),
        "min_ms": round(lat[0], 2),
        "commit_to_claim_median_ms": round(statistics.median(r[1] for r in rows), 2),
        "claim_to_start_median_ms": round(statistics.median(r[2] for r in rows), 2),
    }
    if len(probes) > 1:
        result["probes"] = len(probes)
        result["probe_medians_ms"] = [
            round(statistics.median(r[0] for r in probe), 2) if probe else None for probe in probes
        ]
    expected = LATENCY_JOBS * len(probes)
    if len(lat) != expected:
        result["warning"] = f"{len(lat)} of {expected} jobs ran within 60 s"
    return result


def rate(n: int, seconds: float) -> dict[str, Any]:
    """Return a count, its duration and the jobs per second."""
    return {
        "jobs": n,
        "seconds": round(seconds, 4),
        "jobs_per_s": round(n / seconds, 1) if seconds > 0 else None,
    }


# ---------------------------------------------------------------------------
# Printing


def num(value: float | None) -> str:
    """Format a rate with thousands separators."""
    return "n/a" if value is None else f"{value:,.0f}"


def ratio(hopper: float | None, bound: float | None) -> str:
    """Return ``0.52 x``, or ``n/a`` when either figure is missing."""
    if not hopper or not bound:
        return "n/a"
    return f"{hopper / bound:.2f} x"


def render(engine: str, title: str, r: dict[str, Any]) -> str:
    """Return the table of one run (or of the medians of several)."""
    raw, enq, proc = r["raw"], r["enqueue"], r["processing"]
    one, two = raw["cycle_1conn"]["jobs_per_s"], raw["cycle_2conn"]["jobs_per_s"]
    ins1, insm = raw["insert_one"]["jobs_per_s"], raw["insert_multi"]["jobs_per_s"]
    lines = [f"== {engine}: {title} ==", ""]

    def line(
        label: str,
        value: float | None,
        bound: float | None,
        bound_label: str,
        extra: str = "",
        shown: float | None = None,
    ) -> None:
        """One hopper figure beside its bound; ``shown``: its ratio, when not value / bound."""
        as_ratio = ratio(value, bound) if shown is None else f"{shown:.2f} x"
        lines.append(
            f"  {label:<44} hopper {num(value):>7} jobs/s = {as_ratio} "
            f"{bound_label} ({num(bound)}){extra}"
        )

    def paired(figure: dict[str, Any]) -> tuple[float | None, str, float | None]:
        """The bound of an enqueue figure, its label, and the ratio to show.

        Alternated pairs: the raw insert's rate in the pairs and the median of
        the pairs' ratios; a run written before them: the run's raw insert.
        """
        if figure.get("raw_jobs_per_s"):
            return figure["raw_jobs_per_s"], "raw one-row insert, alternated", figure.get("ratio")
        return ins1, "raw one-row insert", None

    lines.append("Enqueue")
    bound, label, shown = paired(enq["one_per_tx"])
    line(
        "enqueue(), one job per transaction",
        enq["one_per_tx"]["jobs_per_s"],
        bound,
        label,
        shown=shown,
    )
    line(
        "enqueue(), unique key, one per transaction",
        enq["unique_one_per_tx"]["jobs_per_s"],
        ins1,
        "raw one-row insert",
    )
    line(
        "enqueue_many(), batches of 1,000",
        enq["many_1000"]["jobs_per_s"],
        insm,
        "raw multi-row insert",
    )
    line(
        "enqueue_many(), unique key per job, 1,000",
        enq["unique_many_1000"]["jobs_per_s"],
        insm,
        "raw multi-row insert",
    )
    wf = r.get("workflow")
    if wf:
        lines.append(
            f"  workflow of {num(wf['jobs'])} jobs ({num(wf.get('edges'))} edges), one "
            f"transaction: {wf['seconds']:.2f} s (build {wf.get('build_s', 0):.2f} s + "
            f"enqueue {wf.get('insert_s', 0):.2f} s) = {num(wf['jobs_per_s'])} jobs/s"
        )
    lines.append("Processing (no-op jobs, concurrency 10 per process)")
    for key, bound, label, what in (
        ("1proc", one, "raw 1 conn", "1 worker process"),
        ("2proc", two, "raw 2 conns", "2 worker processes"),
        ("1proc_c100", one, "raw 1 conn", "(diagnostic) 1 process, concurrency 100"),
    ):
        p = proc.get(key)
        if p:
            extra = f"; CPU {p.get('cpu_us_per_job', 0):,.0f} µs/job"
            line(what, p["jobs_per_s"], bound, label, extra)
    observed = proc.get("1proc_observed")
    if observed:
        lines.append("  " + render_observed(observed, proc["1proc"]["jobs_per_s"]))
    empty = r["growth"]["empty"]
    lines.append("Hot statements alone (10 jobs, rolled back; median wall ms in the runner)")
    for name in ("claim", "finalize"):
        st = empty.get(name) or {}
        server = (
            f" (server: plan {st['planning_ms']:.2f} + run {st['execution_ms']:.2f} ms)"
            if "execution_ms" in st
            else ""
        )
        wall = st.get("median_ms")
        lines.append(f"  {name:<9} {wall if wall is not None else 0:6.2f} ms{server}")
    lat = r["latency"]
    lines.append("Pickup latency (idle worker, 200 jobs 20 ms apart)")
    lines.append(
        f"  median {lat.get('median_ms', 0):.1f} ms, p95 {lat.get('p95_ms', 0):.1f} ms, "
        f"max {lat.get('max_ms', 0):.1f} ms; median split: commit -> claim "
        f"{lat.get('commit_to_claim_median_ms', 0):.1f} ms, claim -> job start "
        f"{lat.get('claim_to_start_median_ms', 0):.1f} ms"
    )
    keyed = r.get("keyed_claim") or {}
    if "first_ms" in keyed:
        lines.append(
            f"Keyed claim ({keyed['blocked']:,} jobs behind one head, {keyed['keys']:,} keys): "
            f"first of 50 {keyed['first_ms']:.1f} ms, then {keyed['each_ms']:.1f} ms per 10"
        )
    lines.append("Cost as the work grows (1 process; ratios to the empty case)")
    base = r["growth"]["empty"]
    for key in ("empty", "waiting_small", "waiting_large", "history_large"):
        c = r["growth"][key]
        what = (
            f"{num(c['history'])} rows in history"
            if c["history"]
            else f"{num(c['waiting'])} jobs waiting"
        )
        tp, btp = c["processing"]["jobs_per_s"], base["processing"]["jobs_per_s"]
        med, bmed = c["latency"].get("median_ms"), base["latency"].get("median_ms")
        claim = c.get("claim") or {}
        claim_ms = claim.get("median_ms")
        lines.append(
            f"  {what:<26} {num(tp):>7} jobs/s = {ratio(tp, btp)} empty; "
            f"latency median {med or 0:.1f} ms = {ratio(med, bmed)} empty "
            f"(p95 {c['latency'].get('p95_ms', 0):.1f}); claim of 10 alone "
            + (f"{claim_ms:.2f} ms" if claim_ms is not None else "n/a")
            + (
                f" (server: plan {claim['planning_ms']:.2f} + run {claim['execution_ms']:.2f})"
                if "execution_ms" in claim
                else ""
            )
        )
    mem = r["memory"]
    rss = mem.get("rss_kb") or {}
    lines.append(f"Memory (1 worker, {num(mem['jobs'])} jobs)")
    marks = " / ".join(
        f"{k} {v / 1024:.1f} MB"
        for k, v in sorted(rss.items(), key=lambda kv: int(kv[0][:-1]))
        if v
    )
    peak = mem.get("peak_rss_kb")
    lines.append(f"  RSS at {marks or 'n/a'}; peak {peak / 1024 if peak else 0:.1f} MB")
    lines.append("Raw-SQL bound (this run)")
    lines.append(f"  claim 100 + finalize 100: {num(one)} jobs/s on 1 connection, {num(two)} on 2")
    lines.append(
        f"  inserts: {num(ins1)} rows/s one per transaction, "
        f"{num(insm)} rows/s in multi-row statements of 1,000"
    )
    cold = r.get("cold")
    if cold:
        lines.append(
            f"Cold (fresh database, no warm-up, {num(cold['jobs'])} jobs enqueued one per "
            "transaction, long-running workers)"
        )
        bound, label, shown = paired(cold["enqueue_one_per_tx"])
        line(
            "enqueue() in atomic(), one per transaction",
            cold["enqueue_one_per_tx"]["jobs_per_s"],
            bound,
            label,
            shown=shown,
        )
        for key, bound, label, what in (
            ("1proc", one, "raw 1 conn", "1 worker process"),
            ("2proc", two, "raw 2 conns", "2 worker processes"),
        ):
            p = cold.get(key)
            if p:
                extra = f"; CPU {p.get('cpu_us_per_job', 0):,.0f} µs/job with start-up"
                line(what, p["jobs_per_s"], bound, label, extra)
        clat = cold.get("latency") or {}
        lines.append(
            f"  pickup from commit: median {clat.get('median_ms', 0):.1f} ms, "
            f"p95 {clat.get('p95_ms', 0):.1f} ms"
        )
    trips = r.get("round_trips")
    if trips:
        lines.append("Round trips (libpq trace; structural, independent of load)")
        for label, c in trips.items():
            lines.append(
                f"  {label:<44} {c.get('round_trips', 0):.0f} round trip(s), "
                f"{c.get('statements', 0):.0f} statement(s)"
            )
    lines.extend(render_targets(engine, r))
    warnings = list(find_warnings(r))
    if warnings:
        lines.append("Warnings")
        lines.extend(f"  {w}" for w in warnings)
    return "\n".join(lines)


def render_growth(engine: str, title: str, r: dict[str, Any]) -> str:
    """Return the table of a ``--growth-only`` run: each case against the empty one, memory."""
    lines = [f"== {engine}: {title} (growth and memory only) ==", ""]
    base = r["growth"]["empty"]
    for c in r["growth"].values():
        what = (
            f"{num(c['history'])} rows in history"
            if c["history"]
            else f"{num(c['waiting'])} jobs waiting"
        )
        tp, btp = c["processing"]["jobs_per_s"], base["processing"]["jobs_per_s"]
        med, bmed = c["latency"].get("median_ms"), base["latency"].get("median_ms")
        p95 = c["latency"].get("p95_ms", 0)
        lines.append(
            f"  {what:<28} {num(tp):>7} jobs/s = {ratio(tp, btp)} empty; latency median "
            f"{med or 0:.1f} ms = {ratio(med, bmed)} empty (p95 {p95:.1f})"
        )
    mem = r["memory"]
    rss = mem.get("rss_kb") or {}
    marks = " / ".join(f"{k} {v / 1024:.1f} MB" for k, v in rss.items() if v)
    lines.append(f"Memory (1 worker, {num(mem['jobs'])} jobs): RSS at {marks or 'n/a'}")
    lines.extend(render_targets(engine, r))
    return "\n".join(lines)


def find_warnings(r: Any, path: str = "") -> Any:
    """Yield every ``warning`` in a result tree, with where it was found."""
    if isinstance(r, dict):
        for k, v in r.items():
            if k == "warning":
                yield f"{path}: {v}"
            else:
                yield from find_warnings(v, f"{path}.{k}" if path else k)


def median_tree(runs: list[Any]) -> Any:
    """Return the runs' tree with each number replaced by its median across runs."""
    first = runs[0]
    if isinstance(first, dict):
        return {
            k: median_tree([r[k] for r in runs if isinstance(r, dict) and k in r])
            for k in first
            if k != "warning"
        }
    if isinstance(first, int | float) and not isinstance(first, bool):
        values = [r for r in runs if isinstance(r, int | float)]
        return statistics.median(values) if values else None
    return first


# ---------------------------------------------------------------------------
# Entry points


def prepare_database() -> None:
    """Recreate the benchmark database and migrate it, so every run starts clean."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    db = settings.DATABASES["default"]
    if connection.vendor == "postgresql":
        from psycopg import sql

        from bench.postgres_setup import maintenance_connection

        with maintenance_connection(db) as conn:
            name = sql.Identifier(db["NAME"])
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(str(db["NAME"]) + suffix).unlink(missing_ok=True)
    call_command("migrate", verbosity=0, interactive=False)


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``args.runs`` runs on one engine; print a table per run; return the results."""
    os.environ["BENCH_ENGINE"] = args.engine
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    prepare_database()
    suite = Suite(args)
    if args.pgbouncer:
        figures = suite.measure_pgbouncer()
        print(render_pgbouncer(figures), flush=True)
        return {"pgbouncer": figures}
    if args.observe:
        figures = suite.measure_observe(args.runs, args.observe_setups)
        print(render_observe(suite.engine_name, figures), flush=True)
        return {"observe": figures}
    runs = []
    for i in range(0 if args.profile_only else args.runs):
        suite.progress(f"run {i + 1} of {args.runs} (scale {args.scale})")
        result = suite.run_once()
        runs.append(result)
        show = render_growth if args.growth_only else render
        print(show(suite.engine_name, f"run {i + 1} of {args.runs}", result), flush=True)
        print(flush=True)
    out: dict[str, Any] = {"runs": runs}
    if len(runs) > 1:
        out["median"] = median_tree(runs)
        # A median's pairs would be the first run's: the runs' own are in "runs".
        observed = out["median"].get("processing", {}).get("1proc_observed")
        if isinstance(observed, dict):
            observed.pop("pairs", None)
        for figure in (
            out["median"].get("enqueue", {}).get("one_per_tx"),
            *(out["median"].get("cold", {}).get(k) for k in ENQUEUE_KEYS),
        ):
            if isinstance(figure, dict):
                figure.pop("pairs", None)
        show = render_growth if args.growth_only else render
        print(show(suite.engine_name, f"median of {len(runs)} runs", out["median"]), flush=True)
        print(flush=True)
    if args.profile or args.profile_only:
        out["profile"] = suite.profile(RESULTS_DIR / f"profile-{suite.engine_name}.txt")
        from bench.profile import render_summary

        print(render_summary(out["profile"]), flush=True)
    return out


#: The set-ups ``--observe`` runs beside off (``--observe-setups`` picks some).
OBSERVE_SETUPS = ("on_sampled_all", "on_sampled_0.1", "on_sampled_0.1_prometheus")


def render_observe(engine: str, r: dict[str, Any]) -> str:
    """Return the throughput with tracing and metrics on as ratios to off, as a table."""
    lines = [f"{engine}: processing with tracing + metrics on, as a ratio to off (same round)"]
    names = [n for n in OBSERVE_SETUPS if n in r["rounds"][0]]
    for i, row in enumerate(r["rounds"], 1):
        cells = [f"off {num(row['off']['jobs_per_s'])}/s"]
        for name in names:
            cells.append(f"{name} {num(row[name]['jobs_per_s'])}/s ({row[f'ratio_{name}']})")
        lines.append(f"  round {i}: " + ", ".join(cells))
    for name in names:
        lines.append(
            f"  median ratio {name}: {r[f'ratio_{name}']}; CPU per job "
            f"{r['cpu_us_per_job_off']} -> {r[f'cpu_us_per_job_{name}']} µs "
            f"(+{r[f'extra_cpu_us_{name}']})"
        )
    return "\n".join(lines)


def render_observed(observed: dict[str, Any], off: float | None) -> str:
    """Return the line of the in-run tracing + metrics figure (pairs, or one run before them)."""
    what = "1 process, tracing (0.1) + metrics on"
    pairs = observed.get("pairs")
    if not isinstance(pairs, list) and observed.get("ratio") is not None:  # the runs' medians
        return (
            f"{what:<44} {observed['ratio']:.2f} x off, the median of the runs' medians of "
            f"alternated off/on pairs; on {num(observed['jobs_per_s'])} / off "
            f"{num(observed.get('off_jobs_per_s'))} jobs/s"
        )
    if not isinstance(pairs, list):  # one on run against the run's 1-process figure
        return (
            f"{what:<44} hopper {num(observed['jobs_per_s']):>7} jobs/s = "
            f"{ratio(observed['jobs_per_s'], off)} 1 process, off ({num(off)})"
        )
    each = " / ".join(
        f"{p['ratio']:.2f}{'' if p['first'] == 'off' else '*'}" if p["ratio"] else "n/a"
        for p in pairs
    )
    shown = "n/a" if observed.get("ratio") is None else f"{observed['ratio']:.2f} x"
    return (
        f"{what:<44} {shown} off, median of {len(pairs)} alternated off/on pairs ({each}; "
        f"* on first); on {num(observed['jobs_per_s'])} / off "
        f"{num(observed.get('off_jobs_per_s'))} jobs/s, CPU "
        f"{observed.get('off_cpu_us_per_job') or 0:,.0f} -> "
        f"{observed.get('cpu_us_per_job') or 0:,.0f} µs/job"
    )


def render_pgbouncer(r: dict[str, Any]) -> str:
    """Return the throughput through PgBouncer beside direct, as a table."""
    lines = ["postgres: processing through PgBouncer (jobs/s; ratio to direct)"]
    for procs in (1, 2):
        direct = r[f"direct_{procs}proc"]["jobs_per_s"]
        row = f"  {procs} worker process(es): direct {num(direct)}"
        for mode in ("direct_unprepared", "transaction", "session"):
            bounced = r[f"{mode}_{procs}proc"]["jobs_per_s"]
            row += f", {mode} {num(bounced)} ({r[f'ratio_{mode}_{procs}proc']}x)"
        lines.append(row)
    return "\n".join(lines)


def meta(args: argparse.Namespace) -> dict[str, Any]:
    """Return what the JSON needs to compare runs: when, where, at which size."""
    import django

    return {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "scale": args.scale,
        "runs": args.runs,
        "python": platform.python_version(),
        "django": django.get_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "sizes": {k: size(k, args.scale, args.full) for k in SIZES},
        "cold_jobs": cold_jobs(args.scale, args.cold_jobs) if args.cold else 0,
        "full": args.full,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--engine", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="Multiply every job count (1.0: the full size the targets quote).",
    )
    parser.add_argument("--runs", type=int, default=1, help="Runs per engine (medians printed).")
    parser.add_argument("--json", type=Path, help="Write results here (default bench-results/).")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="Finally profile one worker with py-spy; summarize where it spends.",
    )
    parser.add_argument(
        "--profile-only", action="store_true", help="Only profile one worker (no measured runs)."
    )
    parser.add_argument("--quiet", action="store_true", help="No progress lines on stderr.")
    parser.add_argument(
        "--no-cold",
        dest="cold",
        action="store_false",
        help="Skip the cold section (a fresh database, jobs enqueued one per transaction, "
        "long-running workers, no warm-up).",
    )
    parser.add_argument(
        "--growth-only",
        action="store_true",
        help="Only the growth cases (empty, many waiting, large history) and the memory run; "
        "with --full at 10^6 / 10^6 / 10^5.",
    )
    parser.add_argument(
        "--cold-jobs",
        type=int,
        default=None,
        help="Jobs of the cold section (default: 20,000 at --scale 0.25 and above, fewer below).",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="Measure growth at 10^6 waiting jobs and 10^6 history rows and memory over "
        "10^5 jobs whatever --scale (long).",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="PostgreSQL only: processing throughput through PgBouncer (transaction and "
        "session pooling) as a ratio to direct, instead of the suite.",
    )
    parser.add_argument(
        "--observe",
        action="store_true",
        help="Only processing with tracing and metrics off and on, alternating --runs rounds; "
        "ratios to off and CPU per job.",
    )
    parser.add_argument(
        "--observe-setups",
        type=lambda v: [name for name in v.split(",") if name],
        default=[],
        metavar="NAMES",
        help="With --observe: only these set-ups beside off, comma-separated ("
        + ", ".join(OBSERVE_SETUPS)
        + "); on_sampled_0.1_prometheus alone is the target's set-up, the cheapest to repeat.",
    )
    args = parser.parse_args(argv)
    unknown = set(args.observe_setups) - set(OBSERVE_SETUPS)
    if unknown:
        parser.error(f"--observe-setups: unknown {', '.join(sorted(unknown))}")
    if args.observe and args.engine == "both":
        parser.error("--observe needs --engine postgres or sqlite")
    if args.pgbouncer and args.engine != "postgres":
        parser.error("--pgbouncer needs --engine postgres")
    if args.runs < 1 or args.scale <= 0:
        parser.error("--runs must be at least 1 and --scale positive")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write the JSON; return an exit code."""
    args = parse_args(argv)
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.json or RESULTS_DIR / f"{stamp}.json"
    before = resource.getrusage(resource.RUSAGE_SELF)
    engines: dict[str, Any] = {}
    if args.engine == "both":
        # One child per engine: Django's settings (the database) are per process.
        for engine in ("postgres", "sqlite"):
            part = RESULTS_DIR / f"{stamp}-{engine}.part.json"
            cmd = [
                sys.executable,
                "-m",
                "bench.run",
                "--engine",
                engine,
                "--scale",
                str(args.scale),
                "--runs",
                str(args.runs),
                "--json",
                str(part),
            ]
            cmd += ["--profile"] * args.profile + ["--profile-only"] * args.profile_only
            cmd += ["--quiet"] * args.quiet
            cmd += ["--no-cold"] * (not args.cold) + ["--full"] * args.full
            cmd += ["--cold-jobs", str(args.cold_jobs)] if args.cold_jobs else []
            cmd += ["--growth-only"] * args.growth_only
            code = subprocess.call(cmd, cwd=BASE_DIR, env=worker_env())
            if code:
                print(f"bench: the {engine} run failed (exit {code})", file=sys.stderr)
                return code
            engines.update(json.loads(part.read_text())["engines"])
            part.unlink()
    else:
        engines[args.engine] = run_engine(args)
    result = {"meta": meta(args), "engines": engines}
    result["meta"]["runner_cpu_s"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_utime - before.ru_utime, 2
    )
    path.write_text(json.dumps(result, indent=2, default=str))
    if args.json is None or args.engine == "both":
        print(f"results written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
