"""The raw-SQL bound: hopper's own tables driven by a tight driver loop, no worker around it.

Each figure here is what the database and driver can do on this machine, in
this run, with the same rows and indexes hopper uses: claim 100 with one
statement (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, one ``BEGIN IMMEDIATE``
transaction on SQLite), finalize 100 with one statement that moves them to
history (fenced like hopper's), one-row inserts and multi-row inserts of 1,000.
Hopper's figures are printed as ratios to these, so a noisy machine shows up in
both and cancels out.

The functions take plain connection settings (not Django objects) so that
they can run in forked processes with connections of their own.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Any

import uuid_utils

#: The kind the raw rows carry; the worker never sees them (queue ``raw``).
RAW_KIND = "bench.jobs.noop"
RAW_QUEUE = "raw"
ARGS_JSON = '{"args": [], "kwargs": {}}'
BATCH = 100
INSERT_BATCH = 1000

#: The columns hopper's insert writes, in this order.
INSERT_COLS = (
    "id, kind, queue, state, priority, attempt, max_attempts, scheduled_at, fence, args, "
    "metadata, errors, tags, awaited, created_at"
)
#: Every column a job has, live or in history (history adds finalized_at, output).
JOB_COLS = (
    "id, kind, queue, state, priority, attempt, max_attempts, scheduled_at, attempted_at, "
    "attempted_by, fence, args, metadata, errors, unique_key, ordering_key, partition_key, "
    "tags, batch_id, expires_at, cancel_requested_at, awaited, created_at, snooze_reason, "
    "progress, lease_token, lease_expires_at, lease_renewed_at, step"
)
_JOB_COLS_COMPLETED = JOB_COLS.replace("queue, state,", "queue, 'completed',")

PG_CLAIM = f"""
UPDATE hopper_job j
SET state = 'running', attempt = j.attempt + 1, fence = j.fence + 1,
    attempted_at = now(), attempted_by = %s
FROM (SELECT id FROM hopper_job
      WHERE queue = '{RAW_QUEUE}' AND state = 'available'
      ORDER BY priority DESC, scheduled_at, id
      LIMIT {BATCH}
      FOR UPDATE SKIP LOCKED) p
WHERE j.id = p.id
RETURNING j.id, j.fence, j.kind, j.args, j.attempt
"""

PG_FINALIZE = f"""
WITH gone AS (
    DELETE FROM hopper_job j
    USING unnest(%s::uuid[], %s::int8[]) AS i(id, fence)
    WHERE j.id = i.id AND j.fence = i.fence AND j.state = 'running'
    RETURNING j.*
)
INSERT INTO hopper_job_history ({JOB_COLS}, finalized_at, output)
SELECT {_JOB_COLS_COMPLETED}, now(), NULL FROM gone
"""

SQLITE_CLAIM = f"""
UPDATE hopper_job
SET state = 'running', attempt = attempt + 1, fence = fence + 1,
    attempted_at = ?, attempted_by = ?
WHERE id IN (SELECT id FROM hopper_job
             WHERE queue = '{RAW_QUEUE}' AND state = 'available'
             ORDER BY priority DESC, scheduled_at, id
             LIMIT {BATCH})
RETURNING id, fence, kind, args, attempt
"""

_SQLITE_PICKED = (
    "SELECT json_extract(value, '$[0]') AS pid, json_extract(value, '$[1]') AS pfence "
    "FROM json_each(?)"
)
SQLITE_FINALIZE_MOVE = f"""
INSERT INTO hopper_job_history ({JOB_COLS}, finalized_at, output)
SELECT {_JOB_COLS_COMPLETED}, ?, NULL
FROM ({_SQLITE_PICKED}) JOIN hopper_job ON id = pid AND fence = pfence
WHERE state = 'running'
"""
SQLITE_FINALIZE_DELETE = f"""
DELETE FROM hopper_job
WHERE state = 'running' AND (id, fence) IN (SELECT pid, pfence FROM ({_SQLITE_PICKED}))
"""


def sqlite_now() -> str:
    """Return now as the SQLite engine stores times (text with 6 fraction digits, UTC)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def pg_connect(conninfo: dict[str, Any]) -> Any:
    """Open an autocommit psycopg connection: each statement is its own transaction."""
    import psycopg

    return psycopg.connect(**conninfo, autocommit=True)


def sqlite_connect(path: str) -> sqlite3.Connection:
    """Open a SQLite connection configured as the bench settings configure Django's."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


# ---------------------------------------------------------------------------
# Seeding (setup, never measured): generate rows in SQL.


def seed_sql(
    vendor: str, *, queue: str, state: str, n: int, delay_days: int = 0, history: bool = False
) -> tuple[str, list[Any]]:
    """Return an ``INSERT ... SELECT`` making ``n`` hopper rows inside the database.

    IDs are time-ordered (a millisecond prefix, then random), like UUIDv7, so
    index locality is what hopper's own IDs give. ``delay_days`` schedules the
    rows in the future; ``history`` writes finalized rows to history instead.
    """
    table = "hopper_job_history" if history else "hopper_job"
    extra_cols = ", attempted_at, finalized_at" if history else ""
    if vendor == "postgresql":
        sched = f"now() + interval '{delay_days} days'"
        extra = ", now(), now()" if history else ""
        sql = f"""
        INSERT INTO {table} ({INSERT_COLS}{extra_cols})
        SELECT (lpad(to_hex((extract(epoch from now()) * 1000)::bigint - %s + g), 12, '0')
                || substr(md5(random()::text || g::text), 1, 20))::uuid,
               %s, %s, %s, 0, {1 if history else 0}, 25, {sched}, 0, %s::jsonb,
               '{{}}'::jsonb, '[]'::jsonb, '[]'::jsonb, false, now(){extra}
        FROM generate_series(1, %s) g
        """
        return sql, [n + 1, RAW_KIND, queue, state, ARGS_JSON, n]
    now = dt.datetime.now(dt.UTC)
    sched = (now + dt.timedelta(days=delay_days)).strftime("%Y-%m-%d %H:%M:%S.%f")
    stamp = now.strftime("%Y-%m-%d %H:%M:%S.%f")
    base_ms = int(now.timestamp() * 1000) - n - 1
    extra = ", ?, ?" if history else ""
    sql = f"""
    WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)
    INSERT INTO {table} ({INSERT_COLS}{extra_cols})
    SELECT printf('%012x', ? + n) || lower(hex(randomblob(10))),
           ?, ?, ?, 0, {1 if history else 0}, 25, ?, 0, ?, '{{}}', '[]', '[]', 0, ?{extra}
    FROM g
    """
    params: list[Any] = [n, base_ms, RAW_KIND, queue, state, sched, ARGS_JSON, stamp]
    if history:
        params += [stamp, stamp]
    return sql, params


# ---------------------------------------------------------------------------
# The claim-and-finalize cycle.


def pg_cycle(conninfo: dict[str, Any], client_id: int) -> tuple[int, float, float]:
    """Claim 100 and finalize 100 until the raw queue is empty; return (jobs, start, end)."""
    done = 0
    with pg_connect(conninfo) as conn:
        cur = conn.cursor()
        start = time.perf_counter()
        while True:
            rows = cur.execute(PG_CLAIM, (client_id,), prepare=True).fetchall()
            if not rows:
                break
            cur.execute(PG_FINALIZE, ([r[0] for r in rows], [r[1] for r in rows]), prepare=True)
            done += len(rows)
        end = time.perf_counter()
    return done, start, end


def sqlite_cycle(path: str, client_id: int) -> tuple[int, float, float]:
    """The same cycle on SQLite: each statement in its own ``BEGIN IMMEDIATE`` transaction."""
    done = 0
    conn = sqlite_connect(path)
    start = time.perf_counter()
    while True:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(SQLITE_CLAIM, (sqlite_now(), client_id)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            break
        picked = json.dumps([[r[0], r[1]] for r in rows])
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(SQLITE_FINALIZE_MOVE, (sqlite_now(), picked))
        conn.execute(SQLITE_FINALIZE_DELETE, (picked,))
        conn.execute("COMMIT")
        done += len(rows)
    end = time.perf_counter()
    conn.close()
    return done, start, end


def _cycle_child(
    fn: Callable[[Any, int], tuple[int, float, float]],
    target: Any,
    client: int,
    barrier: Any,
    out: Any,
) -> None:
    """Run one cycle loop in a forked process after every loop is ready."""
    barrier.wait()
    out.put(fn(target, client))


def run_cycle(vendor: str, target: Any, connections: int) -> tuple[int, float]:
    """Run the cycle on ``connections`` processes at once; return (jobs, seconds).

    Two connections means two processes, as hopper's two-process figure does,
    so the Python side of the loop never shares a GIL. Time runs from the
    earliest start to the latest end (perf_counter is system-wide on Linux).
    """
    fn = pg_cycle if vendor == "postgresql" else sqlite_cycle
    if connections == 1:
        done, start, end = fn(target, 1)
        return done, end - start
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(connections)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_cycle_child, args=(fn, target, i + 1, barrier, out))
        for i in range(connections)
    ]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    total = sum(r[0] for r in results)
    return total, max(r[2] for r in results) - min(r[1] for r in results)


# ---------------------------------------------------------------------------
# Inserts.


def _insert_row(vendor: str) -> tuple[Any, ...]:
    """Return one row of INSERT_COLS minus the trailing time columns, as hopper writes it."""
    job_id: Any = uuid.UUID(bytes=uuid_utils.uuid7().bytes)
    if vendor != "postgresql":
        job_id = job_id.hex
    return (job_id, RAW_KIND, RAW_QUEUE, "available", 0, 0, 25)


def insert_one_by_one(vendor: str, target: Any, n: int, conn: Any = None) -> float:
    """Insert ``n`` rows, one statement and one transaction each; return the seconds taken.

    ``conn``: a connection of :func:`pg_connect` or :func:`sqlite_connect` to
    insert on, kept by the caller across calls (its statement stays prepared);
    without it, one is opened for the call and closed after it.
    """
    if vendor == "postgresql":
        if conn is None:
            with pg_connect(target) as own:
                return insert_one_by_one(vendor, target, n, own)
        sql = (
            f"INSERT INTO hopper_job ({INSERT_COLS}) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, now(), 0, %s::jsonb, '{}', '[]', '[]', false, now())"
        )
        cur = conn.cursor()
        start = time.perf_counter()
        for _ in range(n):
            cur.execute(sql, (*_insert_row(vendor), ARGS_JSON), prepare=True)
        return time.perf_counter() - start
    if conn is None:
        own = sqlite_connect(target)
        try:
            return insert_one_by_one(vendor, target, n, own)
        finally:
            own.close()
    sql = (
        f"INSERT INTO hopper_job ({INSERT_COLS}) VALUES "
        "(?, ?, ?, ?, ?, ?, ?, ?, 0, ?, '{}', '[]', '[]', 0, ?)"
    )
    start = time.perf_counter()
    for _ in range(n):
        now = sqlite_now()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sql, (*_insert_row(vendor), now, ARGS_JSON, now))
        conn.execute("COMMIT")
    return time.perf_counter() - start


def insert_multi_row(vendor: str, target: Any, n: int) -> float:
    """Insert ``n`` rows with multi-row ``INSERT ... VALUES`` of 1,000; return the seconds."""
    batches = [min(INSERT_BATCH, n - i) for i in range(0, n, INSERT_BATCH)]
    if vendor == "postgresql":
        one = "(%s, %s, %s, %s, %s, %s, %s, now(), 0, %s::jsonb, '{}', '[]', '[]', false, now())"
        with pg_connect(target) as conn:
            cur = conn.cursor()
            start = time.perf_counter()
            for size in batches:
                sql = f"INSERT INTO hopper_job ({INSERT_COLS}) VALUES " + ", ".join([one] * size)
                params = [v for _ in range(size) for v in (*_insert_row(vendor), ARGS_JSON)]
                cur.execute(sql, params, prepare=True)
            return time.perf_counter() - start
    one = "(?, ?, ?, ?, ?, ?, ?, ?, 0, ?, '{}', '[]', '[]', 0, ?)"
    conn = sqlite_connect(target)
    start = time.perf_counter()
    for size in batches:
        now = sqlite_now()
        sql = f"INSERT INTO hopper_job ({INSERT_COLS}) VALUES " + ", ".join([one] * size)
        params = [v for _ in range(size) for v in (*_insert_row(vendor), now, ARGS_JSON, now)]
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sql, params)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed
