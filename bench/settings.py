"""Django settings for the benchmark: its own databases, never the tests' or the demo's.

``BENCH_ENGINE`` picks the database (``postgres`` or ``sqlite``); worker
subprocesses inherit it through the environment, so the runner and its workers
always work on the same data. PostgreSQL is reached through the ``PG*``
variables (default 127.0.0.1:5432, user root); the database is
``BENCH_PG_DB`` (default ``hopper_bench``), dropped and recreated by each run.
The SQLite file lives under ``bench-results/`` (git-ignored).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BASE_DIR / "bench-results"
SECRET_KEY = "hopper-bench"
DEBUG = False  # DEBUG=True would keep every query in memory and skew memory and speed
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_hopper"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

ENGINE = os.environ.get("BENCH_ENGINE", "postgres")
PG_DB = os.environ.get("BENCH_PG_DB", "hopper_bench")
SQLITE_FILE = os.environ.get("BENCH_SQLITE_FILE", str(RESULTS_DIR / "hopper_bench.sqlite3"))

if ENGINE == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": PG_DB,
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "root"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            # BENCH_SERVER_SIDE_BINDING=1 measures Django's server-side binding option
            # (psycopg binds parameters on the server and can prepare statements).
            "OPTIONS": {"server_side_binding": os.environ.get("BENCH_SERVER_SIDE_BINDING") == "1"},
        }
    }
    # BENCH_PGBOUNCER_PORT: a PgBouncer (python -m bench.run --pgbouncer starts one) in
    # front of the server; "default" goes through it and "direct" bypasses it.
    if os.environ.get("BENCH_PGBOUNCER_PORT"):
        DATABASES["direct"] = dict(DATABASES["default"])
        DATABASES["default"] = {
            **DATABASES["default"],
            "PORT": os.environ["BENCH_PGBOUNCER_PORT"],
            "DISABLE_SERVER_SIDE_CURSORS": True,
        }
elif ENGINE == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_FILE,
            # What the README recommends for SQLite in production: WAL, IMMEDIATE.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                + os.environ.get("BENCH_SQLITE_PRAGMAS", ""),
            },
        }
    }
else:
    raise RuntimeError(f"BENCH_ENGINE must be postgres or sqlite, not {ENGINE!r}")

HOPPER: dict[str, Any] = {
    "QUEUES": {"bench": 10},
    "DEFAULT_QUEUE": "bench",
    "IMPORTS": ["bench.jobs"],
}
if ENGINE == "postgres" and os.environ.get("BENCH_PGBOUNCER_PORT"):
    HOPPER["POOLERS"] = {"default": os.environ.get("BENCH_PGBOUNCER_MODE", "transaction")}
    HOPPER["DIRECT_DATABASES"] = {"default": "direct"}
if os.environ.get("BENCH_PREPARED_STATEMENTS") == "0":
    HOPPER["PREPARED_STATEMENTS"] = False
# Tracing and metrics are off unless BENCH_OBSERVE=1, which turns them on with
# an OpenTelemetry SDK (bench/observe.py) and its metrics exporter (Prometheus
# reads the same totals at scrape, at no cost per job): the figure "tracing + metrics on" is
# measured against the same work with them off.
# BENCH_OBSERVE=tracing or =metrics turns on one of them alone.
if os.environ.get("BENCH_OBSERVE") in ("1", "tracing", "metrics"):
    HOPPER["IMPORTS"] = ["bench.observe", *HOPPER["IMPORTS"]]
    # The costlier exporter by default: OpenTelemetry records its histograms per
    # attempt; BENCH_OBSERVE_EXPORTER=prometheus measures the other.
    HOPPER["METRICS"] = os.environ.get("BENCH_OBSERVE_EXPORTER", "otel")
    if os.environ["BENCH_OBSERVE"] == "tracing":
        HOPPER["METRICS"] = False
    if os.environ["BENCH_OBSERVE"] == "metrics":
        HOPPER["TRACING"] = False
else:
    HOPPER["TRACING"] = False
    HOPPER["METRICS"] = False
# Set by the runner for warm processing runs: the workers wait for each other
# after setting up and start claiming together (bench/barrier.py).
if os.environ.get("BENCH_BARRIER"):
    HOPPER["IMPORTS"] = [*HOPPER["IMPORTS"], "bench.barrier"]
if os.environ.get("BENCH_POLL_INTERVAL"):
    HOPPER["POLL_INTERVAL"] = float(os.environ["BENCH_POLL_INTERVAL"])
if os.environ.get("BENCH_FLUSH_INTERVAL"):
    HOPPER["COMPLETER_FLUSH_INTERVAL"] = float(os.environ["BENCH_FLUSH_INTERVAL"])

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_hopper": {"handlers": ["console"], "level": "WARNING"}},
}
# BENCH_WORKER_CONSOLE=1 leaves hopper's loggers to the worker's own console (its
# start and stop lines, with --log-format json their times): worker timelines.
if os.environ.get("BENCH_WORKER_CONSOLE") == "1":
    LOGGING["loggers"] = {}
# BENCH_CLAIM_AHEAD sets HOPPER["CLAIM_AHEAD"] (jobs claimed beyond the free slots
# while jobs are short; unset: hopper's default, the queue's concurrency).
if os.environ.get("BENCH_CLAIM_AHEAD"):
    HOPPER["CLAIM_AHEAD"] = int(os.environ["BENCH_CLAIM_AHEAD"])
