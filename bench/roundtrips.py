"""Count the round trips and statements of hopper's hot calls: ``python -m bench.roundtrips``.

A round trip is one wait for the server's ``ReadyForQuery``: a simple query
(``Q``, e.g. psycopg's ``BEGIN`` and ``COMMIT``) or an extended-protocol batch
ended by a ``Sync`` (``S``; prepared statements, pipelines). They are read
from libpq's own trace of the connection (every protocol message the client
sends), so the count does not depend on the machine's load: it is structural
evidence, beside the timed figures of ``bench.run``.

PostgreSQL only (SQLite has no round trips). Uses the benchmark's database
(``bench/settings.py``), which it migrates if needed and leaves as it found.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.postgres_setup import setup_postgres

#: A message the frontend sent, as libpq's trace writes it:
#: ``<timestamp>\tF\t<length>\t<Message> ...``.
_SENT = re.compile(r"^[^\t]+\tF\t\d+\t(\w+)", re.MULTILINE)


def count(call: Callable[[], Any]) -> dict[str, Any]:
    """Run ``call`` and return the messages it made the default connection send.

    ``round_trips`` counts simple queries and syncs; ``statements`` the
    simple queries and the extended-protocol executions; ``text`` lists the
    simple queries' SQL (BEGIN, COMMIT, SAVEPOINT...).
    """
    from django.db import connection

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            call()
        finally:
            pgconn.untrace()
        trace.seek(0)
        text = trace.read()
    sent = Counter(_SENT.findall(text))
    simple = re.findall(r"\tF\t\d+\tQuery\t \"(.*?)\"", text)
    return {
        "round_trips": sent["Query"] + sent["Sync"],
        "statements": sent["Query"] + sent["Execute"],
        "simple": simple,
        "messages": dict(sent),
    }


def measure() -> dict[str, dict[str, Any]]:
    """Count the hot calls, each after one warm-up call (statements prepared)."""
    from django.db import transaction

    from bench.jobs import noop

    def in_atomic() -> None:
        with transaction.atomic():
            noop.enqueue()

    def two_in_atomic() -> None:
        with transaction.atomic():
            noop.enqueue()
            noop.enqueue()

    def nested() -> None:
        with transaction.atomic(), transaction.atomic():
            noop.enqueue()

    cases: dict[str, Callable[[], Any]] = {
        "enqueue() in autocommit": noop.enqueue,
        "enqueue() in transaction.atomic()": in_atomic,
        "two enqueue() in one atomic()": two_in_atomic,
        "enqueue() in a nested atomic()": nested,
        "enqueue() with a unique key, in atomic()": lambda: _unique(noop),
        "enqueue_many(100) in atomic()": lambda: _many(noop, 100),
    }
    out = {}
    for label, call in cases.items():
        call()  # warm-up: the statement is prepared once per connection
        out[label] = count(call)
    return out


_unique_n = [0]


def _unique(fn: Any) -> None:
    from django.db import transaction

    _unique_n[0] += 1
    with transaction.atomic():
        fn.using(unique_key=f"rt-{os.getpid()}-{_unique_n[0]}").enqueue()


def _many(fn: Any, n: int) -> None:
    from django.db import transaction

    with transaction.atomic():
        fn.enqueue_many([{}] * n)


def main() -> int:
    """Print the round trips of each hot call."""
    if not setup_postgres("bench.roundtrips"):
        return 2
    from django.db import connection

    for label, c in measure().items():
        simple = ", ".join(q if len(q) <= 40 else q[:37] + "..." for q in c["simple"]) or "-"
        print(
            f"{label:<44} {c['round_trips']} round trip(s), {c['statements']} statement(s); "
            f"simple queries: {simple}"
        )
    with connection.cursor() as cur:
        cur.execute("DELETE FROM hopper_job WHERE queue = 'bench'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
