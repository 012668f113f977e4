"""Time the parts of one ``enqueue()`` in ``atomic()``: ``python -m bench.enqueue_parts``.

Each part is timed on its own, on the benchmark's database, as the minimum
(and the median) over ``--rounds`` rounds of ``--n`` calls, so a loaded
machine moves the medians but hardly the minima. The parts:

- the raw bound: one prepared one-row insert in autocommit (``bench.raw``);
- the same insert in the shape of a transaction of its own, the shape
  ``enqueue()`` in ``atomic()`` has: ``BEGIN;EXECUTE`` of it in one simple
  query, then ``COMMIT`` (two round trips, no Python of hopper's or
  Django's): what the second round trip and the transaction block cost on
  this machine, whoever sends them;
- a bare round trip (a prepared ``SELECT 1``) and an empty ``BEGIN``/``COMMIT``;
- hopper's insert statement alone, in autocommit, with and without its
  wake-up, sent from psycopg with the engine's own parameters (no Python of
  hopper's around it);
- ``enqueue()`` in autocommit and in ``atomic()``, and ``enqueue()`` with the
  statement stubbed out (hopper's Python alone);
- Django's ``atomic()`` entered and left around nothing.

``--callgrind raw|atomic|autocommit`` only makes ``--n`` calls of one of
them (the raw insert, ``enqueue()`` in ``atomic()``, ``enqueue()`` alone)
after a warm-up, for valgrind: the client's machine instructions per call,
which no load moves, are (instructions with N - with 0) / N::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python -m bench.enqueue_parts --callgrind atomic --n 1000   # and --n 0

PostgreSQL only. Uses ``bench/settings.py``'s database (``BENCH_PG_DB``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.postgres_setup import setup_postgres

_BOUND = "raw one-row insert, autocommit (bound)"
_TWO_TRIPS = "raw insert, BEGIN;EXECUTE + COMMIT (2 trips)"
_IN_ATOMIC = "enqueue() in atomic()"


#: The raw bound's one-row insert: the columns hopper writes, one prepared statement.
_RAW_SQL = (
    "INSERT INTO hopper_job ({cols}) VALUES "
    "($1, $2, 'bench', $3, $4, $5, $6, now(), 0, $7::jsonb, '{{}}', '[]', '[]', false, now())"
)


def _raw_insert(cur: Any) -> Callable[[], None]:
    """Return a call that makes one raw one-row insert on ``cur`` (a psycopg RawCursor)."""
    from bench import raw

    sql = _RAW_SQL.format(cols=raw.INSERT_COLS)

    def insert() -> None:
        row = raw._insert_row("postgresql")
        cur.execute(sql, (row[0], row[1], *row[3:], raw.ARGS_JSON), prepare=True)

    return insert


def _raw_two_trips(pg: Any) -> Callable[[], None]:
    """Return a call that makes the raw insert in a transaction of two round trips.

    ``BEGIN`` and ``EXECUTE`` of the insert (prepared once, by SQL, under a
    name of its own) in one simple query, then ``COMMIT``: the round trips
    and statements of ``enqueue()`` in ``atomic()``, sent straight on libpq.
    """
    import psycopg
    from psycopg.adapt import Transformer

    from bench import raw

    pgconn = pg.pgconn
    sql = _RAW_SQL.format(cols=raw.INSERT_COLS).encode()
    pgconn.exec_(b"PREPARE bench_raw_two_trips AS " + sql)  # a new connection: a new name
    quote = Transformer(psycopg.RawCursor(pg)).as_literal

    def insert() -> None:
        row = raw._insert_row("postgresql")
        values = (row[0], row[1], *row[3:], raw.ARGS_JSON)
        args = b",".join(quote(v) for v in values)
        for query in (b"BEGIN;EXECUTE bench_raw_two_trips(" + args + b")", b"COMMIT"):
            result = pgconn.exec_(query)
            if result.status not in (psycopg.pq.ExecStatus.COMMAND_OK,):
                raise RuntimeError(result.error_message.decode())

    return insert


def timed(call: Callable[[], Any], n: int, rounds: int) -> tuple[float, float]:
    """Return the minimum and the median of ``rounds`` rounds, µs per call."""
    per: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            call()
        per.append((time.perf_counter() - start) / n * 1e6)
    return min(per), statistics.median(per)


def parts(n: int, rounds: int, flush: bool = True) -> dict[str, tuple[float, float]]:
    """Time each part; return {label: (min µs, median µs)}.

    ``flush=False`` turns ``synchronous_commit`` off for the session: a commit
    then no longer waits for the WAL flush (the same one wait for the raw
    insert and for hopper, and the noisiest part on a shared disk), which
    leaves what hopper adds.
    """
    from unittest import mock

    import psycopg
    from django.db import connection, transaction

    from bench.jobs import noop
    from django_hopper.engine.postgres import jobs as pg_jobs
    from django_hopper.engine.postgres.support import raw_query

    connection.ensure_connection()
    pg = connection.connection
    cur = psycopg.RawCursor(pg)
    if not flush:
        cur.execute(b"SET synchronous_commit = off")
    raw_insert = _raw_insert(cur)
    two_trips = _raw_two_trips(pg)

    def select_1() -> None:
        cur.execute("SELECT 1", prepare=True)

    def begin_commit() -> None:
        cur.execute(b"BEGIN")
        cur.execute(b"COMMIT")

    # hopper's statement with the values the engine sends for noop.enqueue().
    captured: list[tuple[bytes, list[Any]]] = []
    real_execute = psycopg.RawCursor.execute

    def capture(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        captured.append((query, list(params or [])))
        return real_execute(self, query, params, **kw)

    with mock.patch.object(psycopg.RawCursor, "execute", capture):
        noop.enqueue()
    text, values = captured[-1]

    def with_id(vals: list[Any]) -> list[Any]:
        from django_hopper.ids import new_ids

        out = list(vals)
        out[id_at] = new_ids(1)[0]
        return out

    # The statement noop.enqueue() sent: the one-job insert of a job at its
    # defaults (job_insert_many.one), whose wake-up is a pg_notify in its
    # RETURNING list, or the general one (_INSERT_ONE), which takes a notify flag.
    plain_text, plain_names = raw_query(pg_jobs.QUERIES["job_insert_many.one"])
    names = plain_names if text == plain_text else raw_query(pg_jobs._INSERT_ONE)[1]
    id_at = names.index("id")
    notify_at = names.index("notify") if "notify" in names else None
    channel = f"${names.index('channel') + 1}::text".encode()
    quiet_text = text.replace(b"pg_notify(" + channel + b",queue)", channel)
    if notify_at is None and quiet_text == text:  # pragma: no cover - the statement changed
        raise AssertionError("could not take the wake-up out of the insert")

    def statement(notify: bool) -> Callable[[], None]:
        vals = list(values)
        sent = text if notify else quiet_text
        if notify_at is not None:
            vals[notify_at] = notify

        def run() -> None:
            cur.execute(sent, with_id(vals), prepare=True)

        return run

    def atomic_empty() -> None:
        with transaction.atomic():
            pass

    def in_atomic() -> None:
        with transaction.atomic():
            noop.enqueue()

    class _Stub:
        """A prepared cursor that sends nothing and returns one inserted row."""

        def __init__(self, real: Any) -> None:
            self.connection = real.connection
            self.closed = False
            self.pgresult = None

        def execute(self, query: Any, params: Any = None, **kw: Any) -> None:
            from django_hopper.types import JobState

            if query == plain_text:  # RETURNING created_at, the wake-up
                self._row = (NOW, None)
            else:
                self._row = (params[id_at], JobState.AVAILABLE, NOW, None, NOW)

        def fetchall(self) -> list[Any]:
            return [self._row]

    from django.utils import timezone

    NOW = timezone.now()

    def python_only() -> tuple[float, float]:
        """Time enqueue() in autocommit on a cursor that sends nothing."""
        from django_hopper.engine.postgres import support

        saved = getattr(connection, "_hopper_cursor", None)
        connection._hopper_cursor = _Stub(cur)
        try:
            with mock.patch.object(support, "_has_rows", lambda c: True):
                return timed(noop.enqueue, n, rounds)
        finally:
            connection._hopper_cursor = saved

    for call in (raw_insert, two_trips, in_atomic, noop.enqueue):  # warm-up: prepare, plan
        for _ in range(10):
            call()
    calls = {
        _BOUND: raw_insert,
        _TWO_TRIPS: two_trips,
        "bare round trip (prepared SELECT 1)": select_1,
        "BEGIN + COMMIT of nothing (2 round trips)": begin_commit,
        "hopper statement, autocommit, with wake-up": statement(True),
        "hopper statement, autocommit, no wake-up": statement(False),
        "Django atomic() around nothing": atomic_empty,
        "enqueue(), autocommit": noop.enqueue,
        _IN_ATOMIC: in_atomic,
    }
    # Interleaved: every round runs every part once, so a burst of load
    # elsewhere hits all parts alike, and the minima are comparable.
    per: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            per[label].append(timed(call, n, 1)[0])
    out = {label: (min(v), statistics.median(v)) for label, v in per.items()}
    out["enqueue() Python alone (statement stubbed)"] = python_only()
    return out


def calls_only(case: str, n: int) -> None:
    """Make ``n`` calls of one case after 20 of warm-up, and nothing else (for callgrind)."""
    import psycopg
    from django.db import connection, transaction

    from bench.jobs import noop

    connection.ensure_connection()
    cur = psycopg.RawCursor(connection.connection)
    raw_insert = _raw_insert(cur)

    def in_atomic() -> None:
        with transaction.atomic():
            noop.enqueue()

    call = {"raw": raw_insert, "atomic": in_atomic, "autocommit": noop.enqueue}[case]
    if case == "raw":
        connection.connection.autocommit = True
    for _ in range(20):
        call()
    for _ in range(n):
        call()


def main(argv: list[str] | None = None) -> int:
    """Print the parts of one enqueue, µs per call (minimum and median)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="calls per round")
    parser.add_argument("--rounds", type=int, default=25, help="rounds per part")
    parser.add_argument(
        "--no-flush", action="store_true", help="commits do not wait for the WAL flush"
    )
    parser.add_argument(
        "--callgrind",
        choices=("raw", "atomic", "autocommit"),
        default=None,
        help="only make --n calls of this case (0: none), for valgrind --tool=callgrind",
    )
    args = parser.parse_args(argv)
    if not setup_postgres("bench.enqueue_parts"):
        return 2
    from django.db import connection

    try:
        if args.callgrind is not None:
            calls_only(args.callgrind, args.n)
            return 0
        out = parts(args.n, args.rounds, flush=not args.no_flush)
        for label, (low, mid) in out.items():
            print(f"{label:<48} min {low:7.1f} µs   median {mid:7.1f} µs")
        bound, atomic, shape = out[_BOUND], out[_IN_ATOMIC], out[_TWO_TRIPS]
        for label, num, den in (
            ("enqueue() in atomic() / raw insert", bound, atomic),
            ("raw insert in 2 trips / raw insert", bound, shape),
            ("enqueue() in atomic() / raw insert in 2 trips", shape, atomic),
        ):
            print(f"{label:<48} min {num[0] / den[0]:5.2f} x      median {num[1] / den[1]:5.2f} x")
    finally:
        with connection.cursor() as cur:
            cur.execute("DELETE FROM hopper_job WHERE queue = 'bench'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
