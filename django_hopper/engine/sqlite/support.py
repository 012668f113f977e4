"""What the SQLite engine's mixins share: the named queries, the clock, the
transaction wrapper, the hot statements' cursor, the short lock wait and the
translation of driver errors."""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from django.db import Error as DjangoError
from django.db import IntegrityError, OperationalError, transaction
from django.db.backends.signals import connection_created

from django_hopper.engine import topics
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.queries import NAMED_PLACEHOLDER, load
from django_hopper.engine.sqlite.convert import db_time, sql_json_append, sql_json_contains
from django_hopper.exceptions import (
    DatabaseError,
    DatabaseUnavailable,
    HopperError,
    InvalidJob,
    JobLocked,
    duplicate_id,
    unique_conflict,
)

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

    from django_hopper.types import JobID

#: Every named query of the engine (``queries/*.sql``).
Q: dict[str, str] = load(os.path.dirname(__file__))

UTC = dt.UTC
P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("django_hopper.engine")

#: How long a statement told not to wait still waits for the write lock (ms).
SHORT_BUSY_TIMEOUT_MS = 50

#: WAL frames the checkpoints a process runs after its own finalizes aim at
#: (SQLiteSupport._checkpoint_after): under SQLite's automatic checkpoint (1,000
#: frames), which would fire inside a commit, under the write lock.
CHECKPOINT_FRAMES = 500
#: Results finalized before the first such checkpoint; each checkpoint then sets
#: the count before the next from the frames its results wrote (a no-op job
#: writes 0.1-3 frames with its claim, more in small batches), within these bounds.
CHECKPOINT_EVERY_RESULTS = 200
CHECKPOINT_RESULTS_MIN, CHECKPOINT_RESULTS_MAX = 20, 5_000

#: CHECK constraints of the job tables -> the input field each one guards.
_CHECK_FIELDS = {
    "hopper_job_priority_range": "priority",
    "hopper_job_counts": "max_attempts",
    "hopper_job_queue_not_empty": "queue",
    "hopper_job_state_live": "state",
    "hopper_queue_name_not_empty": "queue",
}
_NOT_NULL = re.compile(r"NOT NULL constraint failed: \w+\.(\w+)")

JSON_CONTAINS = "hopper_json_contains"
JSON_APPEND = "hopper_json_append"
TOPIC_MATCHES = "hopper_topic_matches"


def sql_topic_matches(pattern: str | None, topic: str | None) -> bool:
    """Match a topic against a pattern in SQL with the linear matcher, never a regex."""
    return topic is not None and topics.pattern_matches(pattern or "", topic)


def register_functions(raw: Any) -> None:
    """Register hopper's SQL functions on a raw sqlite3 connection."""
    raw.create_function(JSON_CONTAINS, 2, sql_json_contains, deterministic=True)
    raw.create_function(JSON_APPEND, 2, sql_json_append, deterministic=True)
    raw.create_function(TOPIC_MATCHES, 2, sql_topic_matches, deterministic=True)


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Give every new sqlite connection hopper's functions, whatever alias it serves."""
    if connection.vendor == "sqlite":
        register_functions(connection.connection)


connection_created.connect(_on_connection_created, dispatch_uid="django_hopper.sqlite.functions")


def is_locked(exc: BaseException) -> bool:
    """Return whether a driver error means another transaction holds the write lock."""
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def translate_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn driver errors escaping an engine method into hopper exceptions.

    Code above the engine never sees sqlite3 or django.db errors: a violated
    CHECK names the input field, a unique key held by a live job is a
    UniqueConflict, and anything else is a DatabaseError chained to the cause.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except HopperError:
            raise
        except (IntegrityError, sqlite3.IntegrityError) as exc:
            raise integrity_error(exc) from exc
        except (DjangoError, sqlite3.Error) as exc:
            if is_locked(exc) or "unable to open database" in str(exc):
                raise DatabaseUnavailable(f"{fn.__name__}: {exc}") from exc
            raise DatabaseError(f"{fn.__name__}: {exc}") from exc

    return wrapper


def integrity_error(exc: BaseException) -> HopperError:
    """Return the hopper exception that names what an IntegrityError violated."""
    msg = str(exc)
    if "hopper_job.kind, hopper_job.unique_key" in msg:
        return unique_conflict(msg)
    if "UNIQUE constraint failed: hopper_job.id" in msg:
        return duplicate_id(msg)
    for name, field in _CHECK_FIELDS.items():
        if name in msg:
            return InvalidJob(f"invalid {field}: {msg}", field=field)
    m = _NOT_NULL.search(msg)
    if m:
        return InvalidJob(f"{m.group(1)} is required ({msg})", field=m.group(1))
    return DatabaseError(msg)


_RAW: dict[str, str] = {}


def raw_query(sql: str) -> str:
    """Return ``sql`` with each ``%(name)s`` written ``:name`` and ``%%`` written ``%``.

    Converted once per text: Django's cursor formats the whole text with
    ``%`` on every call, then runs it through two wrapper layers.
    """
    out = _RAW.get(sql)
    if out is None:
        out = NAMED_PLACEHOLDER.sub(lambda m: f":{m.group(1)}" if m.group(1) else "%", sql)
        _RAW[sql] = out
    return out


class RawCursor:
    """A sqlite3 cursor that runs the engine's queries, written as for Django's
    cursor, with their text converted once (:func:`raw_query`).

    It runs on the connection of the alias, so its statements are in the
    transaction Django opened; the driver's errors reach the caller as sqlite3
    errors, which :func:`translate_errors` turns into hopper's.
    """

    __slots__ = ("_cursor", "fetchall", "fetchone")

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor
        self.fetchall = cursor.fetchall
        self.fetchone = cursor.fetchone

    def execute(self, sql: str, params: Mapping[str, Any] | Sequence[Any] = ()) -> RawCursor:
        """Run one statement of the engine's queries."""
        self._cursor.execute(raw_query(sql), params)
        return self

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def close(self) -> None:
        self._cursor.close()

    def __enter__(self) -> RawCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()


def _functions_on(wrapper: Any, raw: sqlite3.Connection) -> None:
    """Register hopper's SQL functions on ``raw`` once per connection, even on one
    opened before this module was imported (which ``connection_created`` could not reach)."""
    if getattr(wrapper, "_hopper_functions_on", None) is not raw:
        register_functions(raw)
        wrapper._hopper_functions_on = raw


class WriteLock:
    """A first-come, first-served lock for the write transactions of one database
    file in this process.

    SQLite lets one transaction write at a time. A thread whose ``BEGIN
    IMMEDIATE`` finds another transaction writing waits in SQLite's busy
    handler, which polls by sleeping 1, 2, 5, 10... ms: a claim that finds the
    completer's finalize 0.3 ms from its commit sleeps a millisecond or more.
    Threads of one process queue here instead, and :meth:`release` hands the
    lock straight to the longest waiter, which wakes at once. A releasing
    thread cannot take the lock back ahead of a waiter, so a producer claiming
    in a loop never starves the completer, nor the other way round.

    Other processes (and writes that do not take this lock) still meet the
    busy handler, which is why it stays configured: the lock only orders this
    process's own writers. The thread that holds it may enter again (code run
    at its commit that writes, say) without waiting for itself.
    """

    __slots__ = ("_depth", "_mutex", "_owner", "_waiters")

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._waiters: deque[tuple[threading.Lock, int]] = deque()

    def acquire(self) -> None:
        """Wait for the lock, behind every thread that asked for it before."""
        me = threading.get_ident()
        with self._mutex:
            if self._owner is None:
                self._owner, self._depth = me, 1
                return
            if self._owner == me:
                self._depth += 1
                return
            waiter = threading.Lock()
            waiter.acquire()
            entry = (waiter, me)
            self._waiters.append(entry)
        try:
            waiter.acquire()  # released by the holder that hands the lock over
        except BaseException:
            # The wait was interrupted (a signal handler raised in the main
            # thread): leave the queue, or pass on the lock if it was handed
            # over meanwhile, or it would stay with a thread that never
            # releases it and every writer of the process would wait forever.
            with self._mutex:
                if self._owner == me:
                    self._hand_on()
                else:
                    self._waiters.remove(entry)
            raise

    def release(self) -> None:
        """Hand the lock to the longest waiter, or free it."""
        with self._mutex:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a write lock this thread does not hold")
            self._depth -= 1
            if not self._depth:
                self._hand_on()

    def _hand_on(self) -> None:
        """Give the lock to the longest waiter, or free it (hold the mutex)."""
        if self._waiters:
            waiter, self._owner = self._waiters.popleft()
            self._depth = 1
            waiter.release()  # the lock changed hands without being free
        else:
            self._owner, self._depth = None, 0

    def locked(self) -> bool:
        """Return whether a thread holds the lock."""
        return self._owner is not None

    def __enter__(self) -> WriteLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_WRITE_LOCKS: dict[str, WriteLock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def write_lock(name: str) -> WriteLock:
    """Return the process's write lock of the database file ``name`` (one per file)."""
    lock = _WRITE_LOCKS.get(name)
    if lock is None:
        with _WRITE_LOCKS_GUARD:
            lock = _WRITE_LOCKS.setdefault(name, WriteLock())
    return lock


#: Per database file (this process): [results finalized since the last
#: checkpoint, results due before the next]. Counted without a lock: a lost
#: count only moves a checkpoint by a few results.
_UNCHECKPOINTED: dict[str, list[int]] = {}


class SQLiteSupport(BaseEngine):
    """Helpers of the SQLite engine's mixins; holds no state beyond the alias."""

    def _checkpoint_after(self, results: int) -> None:
        """Count ``results`` just finalized in a transaction this engine opened and
        committed; once enough were that the WAL holds about
        :data:`CHECKPOINT_FRAMES`, checkpoint it here, outside the process's
        write lock.

        SQLite's automatic checkpoint runs inside the ``COMMIT`` that takes the
        WAL past 1,000 frames: copying them into the database file, and syncing
        it, while that commit still holds the process's
        :class:`WriteLock`, so the producer's next claim waits for it. Here the
        finalizing thread (the worker's completer) copies them first without
        holding anything (``PASSIVE``: writers go on meanwhile), then again
        under the write lock, where it copies only the frames committed during
        the first pass (none most often: then it reads the WAL's header and
        returns). The WAL is then fully copied with no writer
        of this process between, so the next transaction starts it again from
        its first frame: it stays bounded. The automatic checkpoint is left as
        it is configured and takes over should these fall behind; durability is
        the database's ``synchronous`` setting either way.

        A failure here changes nothing already committed: it is logged and the
        automatic checkpoint does the work.
        """
        wrapper = self.connection
        raw = wrapper.connection
        if raw is None or wrapper.in_atomic_block or not wrapper.autocommit:
            return  # the caller's transaction, not one this engine committed
        name = wrapper.settings_dict["NAME"]
        count = _UNCHECKPOINTED.get(name)
        if count is None:
            count = _UNCHECKPOINTED[name] = [0, CHECKPOINT_EVERY_RESULTS]
        count[0] += results
        if count[0] < count[1]:
            return
        done, count[0] = count[0], 0
        sql = Q["job_finalize_many.checkpoint"]
        try:
            busy, frames, copied = raw.execute(sql).fetchone()
            if frames > 0:
                # The frames these results (and the claims between) wrote, if the WAL
                # started again since the last checkpoint; more if it did not.
                every = done * CHECKPOINT_FRAMES // frames
                count[1] = min(max(every, CHECKPOINT_RESULTS_MIN), CHECKPOINT_RESULTS_MAX)
            if not busy and frames >= 0:
                # What this process committed while the frames were copied (the
                # first pass copies up to where the WAL ended when it began).
                with write_lock(name):
                    busy, frames, copied = raw.execute(sql).fetchone()
            logger.debug("WAL checkpoint: %d of %d frames copied", copied, frames)
        except sqlite3.Error:
            logger.debug("a WAL checkpoint after a finalize failed", exc_info=True)

    def now(self) -> dt.datetime:
        """Return the machine's clock: SQLite is embedded, so it is the database's."""
        return dt.datetime.now(UTC)

    def _now(self, now: dt.datetime | None) -> tuple[dt.datetime, str]:
        """Return the time a statement uses (``now`` if given) and its stored text."""
        if now is None:
            now = dt.datetime.now(UTC)
        return now, db_time(now)

    @contextmanager
    def _atomic(self, savepoint: bool = False) -> Iterator[None]:
        """Open a block that joins the caller's transaction or starts one.

        Without a savepoint, a failure inside marks the caller's transaction
        for rollback, as any failed write in it would; use a savepoint where a
        failure is expected and recovered from (a lock not available).

        A transaction the block starts holds the process's :class:`WriteLock`
        of the database file from before its ``BEGIN`` to after its ``COMMIT``
        or rollback, so this process's writers take turns without SQLite's
        sleeping busy handler. One that joins the caller's transaction takes
        nothing: the caller's ``BEGIN IMMEDIATE`` holds the write lock already.
        Nor does one run with autocommit off (``set_autocommit(False)``): it
        writes in the caller's transaction, which may hold SQLite's lock, and
        whose end the block does not decide.
        """
        wrapper = self.connection
        if wrapper.in_atomic_block or (wrapper.connection is not None and not wrapper.autocommit):
            with transaction.atomic(using=self.alias, savepoint=savepoint):
                yield
            return
        with write_lock(wrapper.settings_dict["NAME"]), transaction.atomic(using=self.alias):
            yield

    def _cursor(self) -> CursorWrapper:
        """Return a cursor of the alias's connection for this thread, with hopper's
        SQL functions registered even on a connection opened before this module
        was imported (which ``connection_created`` could not reach)."""
        wrapper = self.connection
        cursor = wrapper.cursor()
        _functions_on(wrapper, wrapper.connection)
        return cursor

    def _hot_cursor(self) -> RawCursor | CursorWrapper:
        """Return a cursor for the hot statements (claim, finalize, insert).

        It is a plain sqlite3 cursor of the alias's connection (:class:`RawCursor`)
        unless something observes Django's cursor (``DEBUG``'s query log,
        ``CaptureQueriesContext``, an ``execute_wrapper``), which then gets
        Django's cursor and sees every statement as before.
        """
        wrapper = self.connection
        if wrapper.queries_logged or wrapper.execute_wrappers:
            return self._cursor()
        raw = wrapper.connection
        if raw is None:
            wrapper.ensure_connection()
            raw = wrapper.connection
        # As Django's cursor: no statement in a transaction already marked to roll back.
        wrapper.validate_no_broken_transaction()
        _functions_on(wrapper, raw)
        return RawCursor(raw.cursor())

    @contextmanager
    def _short_lock_wait(self, cursor: RawCursor | CursorWrapper, prefix: str) -> Iterator[None]:
        """Lower the busy timeout while a statement that must not wait runs.

        SQLite has no NOWAIT or SKIP LOCKED: a writer waits for the write lock
        up to the busy timeout. Lowering it makes "another transaction writes"
        show up at once as ``database is locked``.
        """
        cursor.execute(Q[f"{prefix}.busy_timeout"])
        old = int(cursor.fetchone()[0])
        cursor.execute(Q[f"{prefix}.busy_timeout_set"].format(ms=SHORT_BUSY_TIMEOUT_MS))
        try:
            yield
        finally:
            cursor.execute(Q[f"{prefix}.busy_timeout_set"].format(ms=old))

    @contextmanager
    def _job_write_no_wait(
        self, cursor: CursorWrapper, prefix: str, job_id: JobID
    ) -> Iterator[None]:
        """Run the block's writes to one job in a savepoint that does not wait for
        the write lock: while another transaction writes, raise JobLocked naming
        the job, with nothing written (the caller's transaction stays usable)."""
        with self._short_lock_wait(cursor, prefix):
            try:
                with self._atomic(savepoint=True):
                    yield
            except OperationalError as exc:
                if is_locked(exc):
                    raise JobLocked(f"job {job_id} is locked: another transaction writes") from exc
                raise
