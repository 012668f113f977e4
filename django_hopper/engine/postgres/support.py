"""What every part of the PostgreSQL engine shares: its named SQL, the way a
query runs on Django's connection, and the translation of driver errors.

Queries run on the Django connection of the engine's alias, so a call made
inside ``transaction.atomic()`` is part of the caller's transaction (the
transactional-enqueue promise). Driver errors never leave the engine: they
become :mod:`django_hopper.exceptions`.

The hot statements (insert, claim, finalize, progress, client renewal) run as
server-side prepared statements (``prepare=True``): Django's own cursor binds
client side and prepares nothing, so PostgreSQL would parse and plan them on
every call (the plan costs more than the run), and psycopg would re-parse
their text in Python. They run on a plain psycopg cursor over the same raw
connection Django's atomic blocks control, so they stay transactional.
``HOPPER["PREPARED_STATEMENTS"] = False``, or an alias behind a transaction
pooler (``HOPPER["POOLERS"]``: PgBouncer gives each transaction any server
connection, where a statement prepared on another is unknown), sends them
through Django's cursor instead; the SQL works both ways.

PostgreSQL plans a prepared statement for its parameters ("custom" plans)
unless the plan for any parameters ("generic") looks no costlier, and for the
claim it never does once the table is not tiny: ``LIMIT $n`` is estimated at
a tenth of the rows. So the unlimited claim has its limit written in as a
literal (one prepared statement per limit, for limits up to 64; see
``jobs._claim_sql``), and PostgreSQL then settles on the generic plan by
itself. A larger claim, when it is its own transaction, runs with
``plan_cache_mode = force_generic_plan`` set for that transaction only (a
``set_config`` pipelined with it: one round trip, but psycopg's pipeline costs
more client time than the claim). Either generic plan uses the same partial
indexes and is made once per connection (again after ANALYZE).

A statement whose best plan depends on the length of its input arrays runs
unnamed instead (``_fetchall(..., plan_each=True)``: still bound on the
server, one round trip, planned for each call's values). A generic plan
estimates every ``unnest`` of a parameter at ten rows, so a finalize of a
large batch got a nested loop that compared each job with every result (500
results: 250,000 comparisons, ~0.2 s), where the plan for its values joins
them in one pass; the plan costs ~0.5 ms, so only large batches take it.

Results are loaded with psycopg's C timestamptz loader when Django uses
time zones (Django's own loader is a Python subclass psycopg cannot swap).

psycopg sends a transaction's ``BEGIN`` as a query of its own, a round trip,
before the first statement (``Connection._start_query``; in pipeline mode it
follows it with a Sync). A statement that may open the caller's transaction
(``_fetchall(..., begin=True)``: the insert of ``enqueue()``, with or
without a unique key) carries the ``BEGIN`` itself instead: when psycopg would send a
plain ``BEGIN`` next, the statement goes as one simple query, ``BEGIN;EXECUTE
name(literals)``, of a statement hopper prepared under its own name (SQL-level
``EXECUTE`` runs it with the same cached plan). The server is then in the
transaction psycopg would have opened, so psycopg sends no ``BEGIN`` and
Django's ``COMMIT`` or ``ROLLBACK`` ends it as usual. A statement deallocated
under hopper (psycopg's ``DEALLOCATE ALL`` after a rollback, ``DISCARD ALL``)
is prepared again in one more round trip (``_run_with_begin``). Connections
with an isolation level, read-only or deferrable setting of their own keep
psycopg's ``BEGIN``.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal

import psycopg
from django.conf import settings
from django.db import Error as DjangoDatabaseError
from django.db import InterfaceError as DjangoInterfaceError
from django.db import OperationalError as DjangoOperationalError
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import abc
from psycopg.adapt import Transformer
from psycopg.errors import error_from_result
from psycopg.types.datetime import TimestamptzLoader

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.queries import NAMED_PLACEHOLDER, load
from django_hopper.exceptions import (
    DatabaseError,
    DatabaseUnavailable,
    HopperError,
    InvalidJob,
    JobLocked,
    duplicate_id,
    unique_conflict,
)
from django_hopper.topology import prepares

#: Every named query of the engine (``queries/*.sql``).
QUERIES: dict[str, str] = load(os.path.dirname(__file__))

#: SQLSTATEs hopper attributes to a cause of its own.
LOCK_NOT_AVAILABLE = "55P03"
UNIQUE_VIOLATION = "23505"
CHECK_VIOLATION = "23514"
NOT_NULL_VIOLATION = "23502"
READ_ONLY = "25006"

#: The raw connection's prepare_threshold when Django left it None (no
#: preparing): only ``prepare=True`` prepares, never a query run often.
_EXPLICIT_PREPARE_ONLY = 1 << 30

_IDLE = psycopg.pq.TransactionStatus.IDLE
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
_PIPELINE_OFF = psycopg.pq.PipelineStatus.OFF
_CONNECTION_OK = psycopg.pq.ConnStatus.OK
_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE
#: The SQLSTATEs of an EXECUTE whose prepared statement does not exist, and
#: of a PREPARE whose name is taken.
_NO_SUCH_STATEMENT = b"26000"
_STATEMENT_EXISTS = b"42P05"
_FORCE_GENERIC_PLAN = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"


#: What compact() keeps (quoted literals and names) or tightens (punctuation).
_TIGHTEN = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")|\s*([,()])\s*|\s+=\s+|\s+""")
_COMPACT: dict[str, str] = {}


def _tighten(m: re.Match[str]) -> str:
    if m.group(1):
        return m.group(1)
    if m.group(2):
        return m.group(2)
    return "=" if "=" in m.group(0) else " "


def compact(sql: str) -> str:
    """Return ``sql`` without the layout whitespace, memoized.

    A prepared statement's text is sent to the server once; a shorter text is
    a shorter key for psycopg's prepared-statement cache. (Placeholders are
    converted once, by :func:`raw_query`.) Text with a line comment is left
    alone.
    """
    out = _COMPACT.get(sql)
    if out is None:
        out = sql if "--" in sql else _TIGHTEN.sub(_tighten, sql).strip()
        _COMPACT[sql] = out
    return out


_RAW: dict[str, tuple[bytes, tuple[str, ...]]] = {}


def raw_query(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """Return ``sql`` compacted, each ``%(name)s`` written ``$n``, and the names in order.

    The prepared statements run on a ``RawCursor`` with the text converted
    here once: psycopg converts placeholders on every call of a statement
    longer than 4,096 characters (it caches only shorter ones), which for the
    claim (5.5k characters) cost about 0.1 ms of Python per claim. A name used
    twice is one parameter, as psycopg makes it. The text is encoded once too
    (psycopg encodes a ``str`` query on every call).
    """
    out = _RAW.get(sql)
    if out is None:
        names: dict[str, int] = {}

        def number(m: re.Match[str]) -> str:
            name = m.group(1)
            if name is None:
                return "%"
            if name not in names:
                names[name] = len(names) + 1
            return f"${names[name]}"

        out = (NAMED_PLACEHOLDER.sub(number, compact(sql)).encode(), tuple(names))
        _RAW[sql] = out
    return out


_STATEMENT_NAMES: dict[bytes, bytes] = {}

#: What ``_run_with_begin`` keeps per raw connection: the connection, the names
#: it prepared, the Transformer that quotes literals, and the quoted literal of
#: each short text it sent (a job's kind, queue, the wake-up's channel: the
#: same few strings on every enqueue), as that Transformer quoted it.
_NamedState = tuple[Any, set[bytes], abc.Transformer, dict[str, bytes]]
#: Texts up to this long are kept quoted, up to this many per connection (a full
#: cache starts again, so that a stream of distinct texts never crowds out the
#: recurring ones).
_QUOTED_LENGTH_MAX = 256
_QUOTED_MAX = 512


def statement_name(text: bytes) -> bytes:
    """Return the name hopper prepares ``text`` under: ``hopper_`` and a digest of the text.

    A digest, so that a changed text (a new release in a long-lived session)
    is a new statement, never the old one run with new parameters.
    """
    name = _STATEMENT_NAMES.get(text)
    if name is None:
        name = _STATEMENT_NAMES[text] = b"hopper_" + hashlib.sha1(text).hexdigest()[:16].encode()
    return name


def _sends_begin(raw: psycopg.Connection[Any]) -> bool:
    """Return whether psycopg would send a plain ``BEGIN`` of its own before the next statement.

    Read from ``pgconn`` where psycopg's properties would build an object per
    read (``info``), the cheap and most often decisive tests first.
    """
    pgconn = raw.pgconn
    return (
        pgconn.transaction_status == _IDLE
        and not raw.autocommit
        and pgconn.pipeline_status == _PIPELINE_OFF
        and raw.isolation_level is None
        and raw.read_only is None
        and raw.deferrable is None
    )


def _sqlstate(exc: BaseException) -> str | None:
    """Return the SQLSTATE of a psycopg error, or of the one a Django error wraps."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, psycopg.Error):
            return candidate.sqlstate
    return None


def _constraint(exc: BaseException) -> str | None:
    """Return the name of the constraint a psycopg error (or the one Django wraps) names."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, psycopg.Error):
            return candidate.diag.constraint_name
    return None


def translate(exc: BaseException) -> HopperError:
    """Map a driver error to the hopper exception that names its cause."""
    state = _sqlstate(exc)
    detail = str(exc.__cause__ or exc).strip()
    if state == LOCK_NOT_AVAILABLE:
        return JobLocked(f"another transaction holds the job's row: {detail}")
    if state == UNIQUE_VIOLATION:
        if _constraint(exc) == "hopper_job_pkey":
            return duplicate_id(detail)
        return unique_conflict(detail)
    if state in (CHECK_VIOLATION, NOT_NULL_VIOLATION):
        return InvalidJob(f"the database refused the job: {detail}")
    if _connection_lost(exc, state):
        return DatabaseUnavailable(detail or type(exc).__name__)
    return DatabaseError(detail or type(exc).__name__)


def _connection_lost(exc: BaseException, state: str | None) -> bool:
    """Return whether the error says the connection is gone rather than the query is wrong.

    Class 08 is a connection exception; 57P01-57P03 are an administrator's or
    the server's shutdown (``pg_terminate_backend``, a restart); 25006 is a
    write refused by a read-only server (a primary demoted during a failover,
    ``default_transaction_read_only``), which a new connection, to the new
    primary, cures. A psycopg OperationalError without SQLSTATE is a socket
    the server closed.
    """
    if state is not None:
        return state.startswith("08") or state in ("57P01", "57P02", "57P03", READ_ONLY)
    return any(
        isinstance(
            candidate,
            (
                psycopg.OperationalError,
                psycopg.InterfaceError,
                DjangoOperationalError,
                DjangoInterfaceError,
            ),
        )
        for candidate in (exc, exc.__cause__)
    )


class db_errors:
    """Translate driver errors raised in the block into hopper exceptions.

    A class rather than a ``@contextmanager`` generator: every statement runs
    inside one, and entering and leaving a generator-based block costs six
    Python calls against two.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if isinstance(exc, DjangoDatabaseError | psycopg.Error) and not isinstance(
            exc, HopperError
        ):
            raise translate(exc) from exc
        return False


def _has_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Return whether the statement returned rows (``description`` would build its columns)."""
    result = cursor.pgresult
    return result is not None and result.status == _TUPLES_OK


class PostgresSupport(BaseEngine):
    """Query helpers the engine's mixins share."""

    def _atomic(self) -> transaction.Atomic:
        """Return an atomic block that joins the caller's transaction if there is one.

        No savepoint: a method's statements simply become part of whatever
        transaction is running, and commit with it.
        """
        return transaction.atomic(using=self.alias, savepoint=False)

    def _prepared_cursor(
        self, conn: BaseDatabaseWrapper | None = None
    ) -> psycopg.Cursor[Any] | None:
        """Return a server-binding cursor on Django's connection, or None to use Django's.

        None when prepared statements are off for the alias
        (:func:`django_hopper.topology.prepares`), or when Django logs queries or
        has execute wrappers (DEBUG, CaptureQueriesContext, instrumentation),
        which only see statements sent through its own cursor. ``conn``: the
        alias's Django connection when the caller has it already (each lookup
        goes through Django's per-thread storage).
        """
        if conn is None:
            conn = self.connection
        if conn.queries_logged or conn.execute_wrappers or not prepares(self.alias):
            return None
        # What Django's cursor() and execute() check before a statement.
        conn.close_if_health_check_failed()
        conn.ensure_connection()
        conn.validate_thread_sharing()
        conn.validate_no_broken_transaction()
        raw = conn.connection
        # One cursor per raw connection (so per thread), kept for the next
        # statement: building one and its adapters map was ~10% of a busy
        # worker's Python. It is never closed by its users; a new raw
        # connection (a reconnect) gets a new one.
        cursor: psycopg.Cursor[Any] | None = getattr(conn, "_hopper_cursor", None)
        if cursor is not None and cursor.connection is raw and not cursor.closed:
            return cursor
        if raw.prepare_threshold is None:
            raw.prepare_threshold = _EXPLICIT_PREPARE_ONLY
        cursor = psycopg.RawCursor(raw)
        if settings.USE_TZ:
            # Django loads timestamptz through a Python subclass of psycopg's
            # loader (to set the zone), which psycopg cannot swap for its C
            # loader: ~4 µs a value against 0.5, and a claimed job has three.
            # psycopg's own loader gives the same aware datetimes, in the
            # session's TimeZone, which Django sets to its connection's zone.
            cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        conn._hopper_cursor = cursor
        return cursor

    def _fetchall(
        self,
        name: str,
        params: Mapping[str, Any],
        sql: str | None = None,
        *,
        prepare: bool = False,
        generic_plan: bool = False,
        begin: bool = False,
        plan_each: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run a named query and return its rows (prepared with ``prepare``).

        ``plan_each``: with ``prepare``, send it unnamed, so the server plans it
        for this call's values (see the module docstring).

        ``generic_plan``: outside a transaction, run it in one of its own with
        the generic plan forced (see the module docstring). ``begin``: when
        the query opens the caller's transaction, send the ``BEGIN`` with it,
        in the same round trip (see the module docstring).
        """
        with db_errors():
            conn = self.connection
            cursor = self._prepared_cursor(conn) if prepare else None
            if cursor is not None:
                raw = conn.connection
                if begin and _sends_begin(raw):
                    try:
                        return self._run_with_begin(conn, cursor, sql or QUERIES[name], params)
                    except Exception:
                        # Django's wrapper, entered only on the way out of an error.
                        with conn.wrap_database_errors:
                            raise
                if (
                    generic_plan
                    and raw.autocommit
                    and raw.pgconn.transaction_status == _IDLE
                    and psycopg.Pipeline.is_supported()
                ):
                    with conn.wrap_database_errors:
                        return self._run_generic(cursor, sql or QUERIES[name], params)
                text, names = raw_query(sql or QUERIES[name])
                try:
                    cursor.execute(text, [params[n] for n in names], prepare=not plan_each)
                    return cursor.fetchall() if _has_rows(cursor) else []
                except Exception:
                    with conn.wrap_database_errors:
                        raise
            with conn.cursor() as django_cursor:
                django_cursor.execute(sql or QUERIES[name], params)
                if django_cursor.description is None:
                    return []
                return django_cursor.fetchall()  # type: ignore[no-any-return]

    @staticmethod
    def _run_generic(
        cursor: psycopg.Cursor[Any], sql: str, params: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Force the generic plan for the statement: one round trip, one transaction.

        In a pipeline the statements up to the Sync form one implicit
        transaction, so the local setting holds for the statement and ends
        with it; a failure rolls both back.
        """
        raw = cursor.connection
        text, names = raw_query(sql)
        with raw.pipeline(), psycopg.Cursor(raw) as setting:
            setting.execute(_FORCE_GENERIC_PLAN)
            cursor.execute(text, [params[n] for n in names], prepare=True)
        return cursor.fetchall()

    def _run_with_begin(
        self,
        conn: BaseDatabaseWrapper,
        cursor: psycopg.Cursor[Any],
        sql: str,
        params: Mapping[str, Any],
    ) -> list[tuple[Any, ...]]:
        """Open the transaction and run the statement in one simple query; return its rows.

        The parameters are sent as literals quoted by psycopg's own dumpers
        (``Transformer.as_literal``, the ones its client-side cursor uses),
        into ``EXECUTE`` of a statement prepared under :func:`statement_name`.
        The first call on a connection prepares it in the same query
        (``PREPARE`` is not transactional: it outlives a rollback). psycopg
        deallocates every prepared statement when it rolls a transaction back;
        the next call then finds the statement gone, and rolls back its own
        failed ``BEGIN`` (nothing else ran in that transaction), prepares and
        runs again, in one more round trip. ``PQexec`` waits without holding
        the GIL.
        """
        raw = conn.connection
        text, names = raw_query(sql)
        name = statement_name(text)
        state: _NamedState | None = getattr(conn, "_hopper_named", None)
        if state is None or state[0] is not raw:
            state = (raw, set(), Transformer(cursor), {})
            conn._hopper_named = state
        _, prepared, tx, quoted = state
        literals = []
        for n in names:
            value = params[n]
            kind = type(value)
            if kind is str:
                literal = quoted.get(value)
                if literal is None:
                    literal = tx.as_literal(value)
                    if len(value) <= _QUOTED_LENGTH_MAX:
                        if len(quoted) >= _QUOTED_MAX:
                            # Many distinct short texts (args of one-off jobs):
                            # start again, so that the few recurring ones
                            # (kind, queue, channel) are kept quoted.
                            quoted.clear()
                        quoted[value] = literal
            elif kind is uuid.UUID:
                literal = b"'%032x'::uuid" % value.int  # what psycopg writes, without its dumper
            elif kind is int and value >= 0:
                literal = b"%d" % value
            else:
                literal = tx.as_literal(value)
            literals.append(literal)
        run = b"".join((b"BEGIN;EXECUTE ", name, b"(", b",".join(literals), b")"))
        prepare = b"PREPARE " + name + b" AS " + text + b";"
        query = run if name in prepared else prepare + run
        pgconn = raw.pgconn
        # Three tries: taken, then missing, is a transaction pooler moving the
        # session between server connections (two answers, two servers); a
        # missing statement's retry runs on the server the failed BEGIN pins.
        for retry in (False, False, True):
            result = pgconn.exec_(query)
            if result.status == _TUPLES_OK:
                prepared.add(name)
                tx.set_pgresult(result)
                return tx.load_rows(0, result.ntuples, tuple)  # type: ignore[no-any-return]
            sqlstate = result.error_field(_SQLSTATE)
            if retry or sqlstate not in (_NO_SUCH_STATEMENT, _STATEMENT_EXISTS):
                break
            # Deallocated: the failed transaction holds only its BEGIN. Taken:
            # the PREPARE failed alone, and the statement is there.
            query = b"ROLLBACK;" + prepare + run if sqlstate == _NO_SUCH_STATEMENT else run
        prepared.discard(name)
        self._check_result(raw, result)
        raise AssertionError("unreachable")  # pragma: no cover - _check_result raised

    @staticmethod
    def _check_result(raw: psycopg.Connection[Any], result: psycopg.pq.abc.PGresult) -> None:
        """Raise the psycopg error a failed ``PQexec`` result stands for."""
        if result.status in (psycopg.pq.ExecStatus.COMMAND_OK, _TUPLES_OK):
            return
        if raw.pgconn.status != _CONNECTION_OK:
            message = raw.pgconn.error_message.decode(errors="replace").strip()
            raise psycopg.OperationalError(message or "the connection is lost")
        raise error_from_result(result, encoding=raw.info.encoding)

    def _fetchone(
        self,
        name: str,
        params: Mapping[str, Any],
        sql: str | None = None,
        *,
        prepare: bool = False,
    ) -> tuple[Any, ...] | None:
        """Run a named query and return its first row, or None (prepared with ``prepare``)."""
        with db_errors():
            cursor = self._prepared_cursor() if prepare else None
            if cursor is not None:
                text, names = raw_query(sql or QUERIES[name])
                with self.connection.wrap_database_errors:
                    cursor.execute(text, [params[n] for n in names], prepare=True)
                    return cursor.fetchone()
            with self.connection.cursor() as django_cursor:
                django_cursor.execute(sql or QUERIES[name], params)
                return django_cursor.fetchone()  # type: ignore[no-any-return]

    def _execute(self, name: str, params: Mapping[str, Any]) -> int:
        """Run a named statement and return how many rows it changed."""
        with db_errors(), self.connection.cursor() as cursor:
            cursor.execute(QUERIES[name], params)
            return int(cursor.rowcount)
