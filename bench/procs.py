"""The two-process figures alone, with each worker's timeline, for alternated A/B runs.

    python -m bench.procs --mode warm --trials 4 --raw --barrier
    python -m bench.procs --mode cold --trials 2 --raw --tree /work/main,.

PostgreSQL only (``BENCH_PG_DB`` names the database; it is dropped and
recreated). Each trial measures what ``bench.run`` measures for its line:

* ``--mode warm``: 2,000 jobs loaded in SQL, vacuumed and analyzed, then
  ``hopper_worker --burst`` processes; with ``--barrier`` they are released
  together once every one has set up (bench/barrier.py), as ``bench.run``
  starts them now; without it they start as they come, as it did before.
* ``--mode cold``: a fresh database, 20,000 ``enqueue()`` one per
  transaction, then long-running workers, stopped once the queue is empty.

Throughput is jobs / (last ``finalized_at`` - first ``attempted_at``) from
history, as in the benchmark; ``--raw`` measures the raw cycle on as many
connections right before (2,000 jobs, as ``--scale 0.1``). ``--tree`` lists
source trees whose ``django_hopper`` the workers run, alternated trial by
trial (the bench package is always this one). One JSON line per trial:
per client, its start line and first claim (seconds from the launch), its
last claim and finalize, its jobs and claims, the size of each claim, and
jobs finalized per 100 ms.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

BASE_DIR = Path(__file__).resolve().parent.parent
RAW_JOBS = 2_000

TIMELINE_SQL = """
SELECT attempted_by, count(*), extract(epoch from min(attempted_at)),
       extract(epoch from max(attempted_at)), extract(epoch from max(finalized_at))
FROM hopper_job_history WHERE queue = 'bench' GROUP BY 1 ORDER BY 3
"""
CLAIMS_SQL = """
SELECT attempted_by, count(*) FROM hopper_job_history WHERE queue = 'bench'
GROUP BY attempted_by, attempted_at ORDER BY attempted_by, attempted_at
"""
BUCKETS_SQL = """
SELECT attempted_by, floor(extract(epoch from finalized_at - %s) * 10)::int, count(*)
FROM hopper_job_history WHERE queue = 'bench' GROUP BY 1, 2 ORDER BY 1, 2
"""


def source_dir(tree: Path) -> Path:
    """Return a directory holding ``tree``'s django_hopper beside this bench package."""
    farm = Path(f"/tmp/hopper-bench-procs-{tree.resolve().name}")
    farm.mkdir(exist_ok=True)
    for name, src in (("django_hopper", tree / "django_hopper"), ("bench", BASE_DIR / "bench")):
        if not (farm / name).exists():
            (farm / name).symlink_to(src.resolve())
    return farm


def start_lines(log: IO[bytes], t0: float) -> dict[int, float]:
    """Return each client's ``worker_started`` time, seconds after ``t0``."""
    log.seek(0)
    out = {}
    for line in log.read().decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "worker_started":
            at = dt.datetime.fromisoformat(rec["time"]).timestamp()
            out[int(rec["client_id"])] = round(at - t0, 3)
    return out


def trial(args: argparse.Namespace, tree: Path, suite: Any) -> dict[str, Any]:
    """Run one measurement; return its figures and timelines."""
    from django.db import connection, connections, transaction

    from bench import raw
    from bench.jobs import noop
    from bench.run import prepare_database, worker_env

    warm = args.mode == "warm"
    n = args.n or (2_000 if warm else 20_000)
    out: dict[str, Any] = {"mode": args.mode, "tree": str(tree), "n": n}
    out["load"] = round(os.getloadavg()[0], 1)
    if args.raw:
        suite.reset()
        suite.seed(queue=raw.RAW_QUEUE, n=RAW_JOBS)
        suite.settle()
        done, seconds = raw.run_cycle("postgresql", suite.target, args.processes)
        out["raw"] = round(done / seconds)
    if warm:
        suite.reset()
        suite.seed(queue="bench", n=n)
        suite.settle()
    else:
        connections.close_all()
        prepare_database()
        connections.close_all()
        for _ in range(n):
            with transaction.atomic():
                noop.enqueue()
    connections.close_all()
    src = source_dir(tree)
    env = worker_env({"BENCH_WORKER_CONSOLE": "1"})
    env["PYTHONPATH"] = str(src) + os.pathsep + env["PYTHONPATH"]
    cmd = [sys.executable, "-m", "django", "hopper_worker", "--queues", "bench:10"]
    cmd += ["--log-format", "json", *(["--burst"] if warm else [])]
    barrier = args.barrier and warm
    fds: tuple[int, ...] = ()
    if barrier:
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        env["BENCH_BARRIER"] = f"{ready_w},{go_r}"
        fds = (ready_w, go_r)
    logs = [open(f"/tmp/hopper-bench-procs-{i}.log", "w+b") for i in range(args.processes)]  # noqa: SIM115
    t0 = time.time()
    procs = [
        subprocess.Popen(cmd, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT, pass_fds=fds)
        for log in logs
    ]
    if barrier:
        os.close(ready_w)
        os.close(go_r)
        ready = 0
        while ready < args.processes:
            got = os.read(ready_r, args.processes)
            if not got:
                raise RuntimeError("a worker exited before it got ready")
            ready += len(got)
        out["released"] = round(time.time() - t0, 3)
        os.close(go_w)
        os.close(ready_r)
    if warm:
        for p in procs:
            p.wait(timeout=300)
    else:
        from django_hopper.models import Job

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
            if not Job.objects.filter(queue="bench").exists():
                break
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
    started: dict[int, float] = {}
    for log in logs:
        started.update(start_lines(log, t0))
        log.close()
    with connection.cursor() as cur:
        cur.execute(TIMELINE_SQL)
        rows = cur.fetchall()
        first = min(float(r[2]) for r in rows)
        last = max(float(r[4]) for r in rows)
        cur.execute(CLAIMS_SQL)
        sizes: dict[int, list[int]] = {}
        for cid, count in cur.fetchall():
            sizes.setdefault(cid, []).append(count)
        cur.execute(BUCKETS_SQL, [dt.datetime.fromtimestamp(first, dt.UTC)])
        buckets: dict[int, dict[int, int]] = {}
        for cid, bucket, count in cur.fetchall():
            buckets.setdefault(cid, {})[bucket] = count
    connections.close_all()
    total = sum(r[1] for r in rows)
    out["jobs_per_s"] = round(total / (last - first))
    if "raw" in out:
        out["ratio"] = round(out["jobs_per_s"] / out["raw"], 2)
    width = max(max(b) for b in buckets.values()) + 1
    out["clients"] = [
        {
            "client": cid,
            "start_line": started.get(cid),
            "first_claim": round(float(lo) - t0, 3),
            "last_claim": round(float(hi) - t0, 3),
            "last_finalize": round(float(fin) - t0, 3),
            "jobs": jobs,
            "claims": sizes.get(cid, []),
            "per_100ms": [buckets.get(cid, {}).get(i, 0) for i in range(width)],
        }
        for cid, jobs, lo, hi, fin in rows
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--mode", choices=("warm", "cold"), default="warm")
    p.add_argument("--trials", type=int, default=3, help="rounds of every tree")
    p.add_argument("--n", type=int, default=0, help="jobs (default 2,000 warm, 20,000 cold)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--tree", default=".", help="comma-separated source trees, alternated")
    p.add_argument("--raw", action="store_true", help="measure the raw cycle before each")
    p.add_argument("--barrier", action="store_true", help="warm: release workers together")
    args = p.parse_args(argv)
    os.environ["BENCH_ENGINE"] = "postgres"
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from bench.run import RESULTS_DIR, Suite, prepare_database

    RESULTS_DIR.mkdir(exist_ok=True)
    prepare_database()
    suite = Suite(argparse.Namespace(scale=0.1, quiet=True, cold_jobs=None))
    for _ in range(args.trials):
        for tree in args.tree.split(","):
            print(json.dumps(trial(args, Path(tree), suite)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
