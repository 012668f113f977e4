"""Measure the admin at scale: ``python -m bench.admin`` (``make bench-admin``).

On PostgreSQL, in a database of its own (``hopper_admin_bench``, created and
dropped by the run): load 1,000,000 history rows and 100,000 live jobs with
``generate_series`` (no Python per row), then time, in-process (the server's
time: the request through Django, the queries and the template, no network),
the pages an operator opens: the live and history lists, filtered lists, a
search by ID and by kind, a job page, the overview. Each page is loaded once
to warm the caches, then ``--repeat`` times; the median is reported. Last,
a bulk cancel of 20,000 jobs ("all matching the filter"); beside them, the
engine reads behind the overview alone (``stats()``, exact, and
``stats(limit=1000)``, bounded). Targets: every page
under 100 ms, the bulk cancel under 5 s (docs/admin.md). The last page is
Django's own user list with 50 users: what rendering a 50-row changelist
costs on this machine, whatever the data.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

DB = os.environ.get("BENCH_ADMIN_DB", "hopper_admin_bench")
HISTORY = 1_000_000
LIVE = 100_000
CANCEL = 20_000
KINDS = 20
QUEUES = ("default", "emails", "reports", "billing", "imports")

HISTORY_SQL = """
INSERT INTO hopper_job_history (id, kind, queue, state, priority, attempt, max_attempts,
    scheduled_at, attempted_at, attempted_by, fence, args, metadata, errors, tags, awaited,
    created_at, finalized_at, output)
SELECT (lpad(to_hex(t.ms), 12, '0') || '7' || substr(md5(g::text), 1, 19))::uuid,
       'bench.kind_' || (g %% {kinds}), (ARRAY{queues})[1 + g %% {nqueues}],
       CASE WHEN g %% 100 < 90 THEN 'completed' WHEN g %% 100 < 97 THEN 'discarded'
            ELSE 'canceled' END,
       0, 1, 25, t.at - interval '2 seconds', t.at - interval '1 second', 1, 1,
       jsonb_build_object('args', jsonb_build_array(g), 'kwargs', '{{}}'::jsonb),
       '{{}}'::jsonb,
       CASE WHEN g %% 100 >= 90 THEN jsonb_build_array(jsonb_build_object(
           'attempt', 1, 'error', 'RuntimeError: bench', 'at', t.at)) ELSE '[]'::jsonb END,
       '[]'::jsonb, false, t.at - interval '2 seconds', t.at, NULL
FROM generate_series(1, %(n)s) g
CROSS JOIN LATERAL (
    SELECT now() - (%(n)s - g) * interval '600 milliseconds' AS at,
           (extract(epoch FROM now() - (%(n)s - g) * interval '600 milliseconds') * 1000)::bigint
               AS ms
) t
"""

LIVE_SQL = """
INSERT INTO hopper_job (id, kind, queue, state, priority, attempt, max_attempts, scheduled_at,
    fence, args, metadata, errors, tags, awaited, created_at)
SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint + g), 12, '0') || '7'
        || substr(md5('live' || g::text), 1, 19))::uuid,
       %(kind)s, %(queue)s, 'available', 0, 0, 25, now(), 0,
       jsonb_build_object('args', jsonb_build_array(g), 'kwargs', '{}'::jsonb),
       '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, false, now()
FROM generate_series(1, %(n)s) g
"""


def admin_db(action: str) -> None:
    """Create or drop the benchmark's own database."""
    import psycopg

    with psycopg.connect(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=os.environ.get("PGPORT", "5432"),
        user=os.environ.get("PGUSER", "root"),
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        if action == "create":
            conn.execute(f'CREATE DATABASE "{DB}"')


def load(history: int, live: int, cancel: int) -> None:
    """Load history and live jobs in SQL, then analyze (as autovacuum would have by then)."""
    from django.db import connection

    queues = "[" + ", ".join(f"'{q}'" for q in QUEUES) + "]"
    with connection.cursor() as cur:
        sql = HISTORY_SQL.format(kinds=KINDS, queues=queues, nqueues=len(QUEUES))
        cur.execute(sql, {"n": history})
        per_queue = live // len(QUEUES)
        for i, queue in enumerate(QUEUES):
            cur.execute(LIVE_SQL, {"n": per_queue, "kind": f"bench.kind_{i}", "queue": queue})
        cur.execute(
            LIVE_SQL.replace("'live'", "'cancel'"),
            {"n": cancel, "kind": "bench.cancel_me", "queue": "bulk"},
        )
        cur.execute(
            "INSERT INTO hopper_queue (name, created_at, updated_at, global_limit, rate_per_sec, "
            "rate_burst, partition_limit, aging) SELECT q, now(), now(), 0, 0, 0, 0, "
            "interval '0' FROM unnest(%s::text[]) q ON CONFLICT DO NOTHING",
            [[*QUEUES, "bulk"]],
        )
        cur.execute("VACUUM ANALYZE hopper_job")
        cur.execute("VACUUM ANALYZE hopper_job_history")


def timed(client: Any, method: str, url: str, data: dict[str, Any] | None = None) -> float:
    """Return the milliseconds one request takes in-process (fails on a bad status)."""
    start = time.perf_counter()
    response = getattr(client, method)(url, data or {})
    took = (time.perf_counter() - start) * 1000
    if response.status_code not in (200, 302):
        raise SystemExit(f"{method.upper()} {url} answered {response.status_code}")
    return took


def database_time(client: Any, url: str, data: dict[str, Any]) -> tuple[int, float]:
    """Return how many queries a page runs and the milliseconds the database spent on them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        client.get(url, data)
    return len(queries), sum(float(q["time"]) for q in queries.captured_queries) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the row counts")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    os.environ["BENCH_ENGINE"] = "postgres"
    os.environ["BENCH_PG_DB"] = DB
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.admin_settings"
    admin_db("create")
    try:
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            admin_db("drop")


def run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from django_hopper.models import Job, JobHistory

    call_command("migrate", verbosity=0)
    history, live = int(HISTORY * args.scale), int(LIVE * args.scale)
    cancel = int(CANCEL * args.scale)
    started = time.perf_counter()
    load(history, live, cancel)
    print(
        f"loaded {history:,} history rows and {live + cancel:,} live jobs "
        f"in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )

    user = get_user_model().objects.create_superuser("bench", "b@example.com", "pw")
    for i in range(49):  # the reference page: Django's own user list, 50 rows
        get_user_model().objects.create_user(f"user{i}")
    client = Client()
    client.force_login(user)
    some_done = JobHistory.objects.order_by("-id").values_list("id", flat=True)[5000]
    some_live = Job.objects.order_by("id").values_list("id", flat=True)[10]
    pages = [
        ("live list", "/admin/django_hopper/job/", {}),
        ("live list, page 50", "/admin/django_hopper/job/", {"p": "50"}),
        ("live list, queue filter", "/admin/django_hopper/job/", {"queue": "emails"}),
        ("history list", "/admin/django_hopper/jobhistory/", {}),
        (
            "history, state+queue",
            "/admin/django_hopper/jobhistory/",
            {"state": "discarded", "queue": "billing"},
        ),
        ("history, kind filter", "/admin/django_hopper/jobhistory/", {"kind": "bench.kind_7"}),
        ("history search: exact ID", "/admin/django_hopper/jobhistory/", {"q": str(some_done)}),
        ("history search: kind", "/admin/django_hopper/jobhistory/", {"q": "bench.kind_3"}),
        ("job page (history)", f"/admin/django_hopper/job/{some_done}/find/", {}),
        ("job page (live)", f"/admin/django_hopper/job/{some_live}/change/", {}),
        ("overview", "/admin/django_hopper/queue/overview/", {}),
        ("queues", "/admin/django_hopper/queue/", {}),
        ("reference: Django's 50 users", "/admin/auth/user/", {}),
    ]
    print(f"{'page':32} {'median ms':>10} {'max ms':>8} {'queries':>8} {'db ms':>7}")
    for name, url, params in pages:
        timed(client, "get", url, params)  # warm
        runs = [timed(client, "get", url, params) for _ in range(args.repeat)]
        count, db_ms = database_time(client, url, params)
        flag = "" if statistics.median(runs) < 100 else "  (over 100 ms)"
        print(
            f"{name:32} {statistics.median(runs):10.1f} {max(runs):8.1f} {count:8d} "
            f"{db_ms:7.1f}{flag}"
        )

    # The engine reads behind the overview: exact stats (for metrics), bounded (the pages).
    from django_hopper import queues

    for name, read in (
        ("engine stats(), exact", lambda: queues.stats()),
        ("engine stats(limit=1000)", lambda: queues.stats(limit=1000)),
    ):
        read()
        runs = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            read()
            runs.append((time.perf_counter() - start) * 1000)
        print(f"{name:32} {statistics.median(runs):10.1f} {max(runs):8.1f}")

    first = (
        Job.objects.filter(kind="bench.cancel_me").order_by("id").values_list("id", flat=True)[0]
    )
    took = timed(
        client,
        "post",
        "/admin/django_hopper/job/?kind=bench.cancel_me",
        {
            "action": "cancel_jobs",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(first)],
        },
    )
    left = Job.objects.filter(kind="bench.cancel_me").count()
    done = JobHistory.objects.filter(kind="bench.cancel_me", state="canceled").count()
    print(
        f"{'bulk cancel of ' + format(cancel, ','):32} {took:10.1f} ms "
        f"({done:,} canceled, {left} left){'' if took < 5000 else '  (over 5 s)'}"
    )


if __name__ == "__main__":
    main()
