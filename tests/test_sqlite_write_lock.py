"""The SQLite engine's in-process write lock: this process's writers take turns in
arrival order, a failed transaction gives the lock back, a transaction joined
inside the caller's takes none, and writers of other processes still get
through SQLite's own lock (the busy timeout; two worker processes on one file:
tests/runtime/test_processes.py)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalizeParams,
    JobInsertOpts,
    JobInsertParams,
)
from django_hopper.engine.sqlite.support import WriteLock, write_lock
from django_hopper.exceptions import DatabaseUnavailable
from tests.support.runtime import wait_for

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite engine specifics")

#: A bound on any wait below, so that a bug fails the test instead of hanging it.
GUARD = 30.0


#: Two jobs: a batch, which the engine inserts in a transaction of its own (one
#: job alone is a single statement in autocommit, no transaction to order).
TWO_JOBS = [JobInsertParams(kind="k", queue="wl"), JobInsertParams(kind="k", queue="wl")]


def _lock() -> WriteLock:
    return write_lock(connection.settings_dict["NAME"])


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread of its own (with its own connection); its result or
    exception lands in the returned list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _waiters(lock: WriteLock) -> int:
    return len(lock._waiters)


# -- the lock alone --------------------------------------------------------------


def test_write_lock__waiters_take_it_in_arrival_order() -> None:
    lock = WriteLock()
    order: list[str] = []
    lock.acquire()
    threads = []
    for name in ("first", "second", "third"):

        def take(name: str = name) -> None:
            with lock:
                order.append(name)

        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        threads.append(thread)
        arrived = len(threads)
        wait_for(lambda arrived=arrived: _waiters(lock) == arrived, GUARD)  # type: ignore[misc]

    lock.release()
    for thread in threads:
        thread.join(GUARD)

    assert order == ["first", "second", "third"]
    assert not lock.locked()


def test_write_lock__a_release_hands_it_to_the_waiter_so_the_releaser_cannot_take_it_back() -> None:
    lock = WriteLock()
    order: list[str] = []
    lock.acquire()

    def waiter() -> None:
        with lock:
            order.append("waiter")

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    wait_for(lambda: _waiters(lock) == 1, GUARD)

    lock.release()
    assert lock.locked()  # handed to the waiter, not freed
    with lock:  # the releaser asks again: it queues behind the waiter
        order.append("releaser")
    thread.join(GUARD)

    assert order == ["waiter", "releaser"]
    assert not lock.locked()


def test_write_lock__its_holder_enters_again_without_waiting_for_itself() -> None:
    lock = WriteLock()
    with lock:
        with lock:  # code run at the holder's commit that writes, say
            assert lock.locked()
        assert lock.locked()
    assert not lock.locked()


def test_write_lock__only_its_holder_releases_it() -> None:
    lock = WriteLock()
    with pytest.raises(RuntimeError):
        lock.release()
    lock.acquire()
    thread, out = _in_thread(lock.release)
    thread.join(GUARD)
    assert isinstance(out[0], RuntimeError)
    assert lock.locked()
    lock.release()


class _InterruptedWait:
    """A waiter's lock whose wait ends in KeyboardInterrupt, as a signal handler
    that raises (Ctrl-C in the main thread) ends a blocking acquire; ``before``
    runs first (the holder may hand the lock over in that time)."""

    def __init__(self, before: Callable[[], None]) -> None:
        self._before = before
        self._held = False

    def acquire(self) -> bool:
        if not self._held:  # the waiter's own lock, taken before it queues
            self._held = True
            return True
        self._before()
        raise KeyboardInterrupt

    def release(self) -> None:
        self._held = False


def _interrupt_a_wait(monkeypatch: pytest.MonkeyPatch, lock: WriteLock, handed_over: bool) -> None:
    """Hold ``lock`` in a thread, have this thread's wait for it interrupted, and
    let the holder release it (before the interrupt when ``handed_over``)."""
    from django_hopper.engine.sqlite import support

    go, released = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            go.wait(GUARD)
        released.set()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    wait_for(lock.locked, GUARD)

    def before() -> None:
        if handed_over:
            go.set()
            released.wait(GUARD)

    fake = SimpleNamespace(Lock=lambda: _InterruptedWait(before), get_ident=threading.get_ident)
    monkeypatch.setattr(support, "threading", fake)
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    monkeypatch.undo()
    go.set()
    thread.join(GUARD)
    assert released.is_set()


@pytest.mark.parametrize("handed_over", [False, True], ids=["waiting", "handed_over"])
def test_write_lock__an_interrupted_wait_leaves_it_free(
    monkeypatch: pytest.MonkeyPatch, handed_over: bool
) -> None:
    lock = WriteLock()
    _interrupt_a_wait(monkeypatch, lock, handed_over)

    # Neither queued nor held by the interrupted thread: free for anyone.
    assert not lock.locked()
    assert _waiters(lock) == 0
    thread, out = _in_thread(lambda: lock.acquire() or lock.release() or "taken")
    thread.join(GUARD)
    assert out == ["taken"]


def test_write_lock__one_lock_per_database_file() -> None:
    assert write_lock("/a/file.sqlite3") is write_lock("/a/file.sqlite3")
    assert write_lock("/a/file.sqlite3") is not write_lock("/another/file.sqlite3")


# -- the engine's transactions ----------------------------------------------------


def _client(engine: BaseEngine) -> int:
    import datetime as dt

    return engine.client_register(ClientRegisterParams("h", dt.timedelta(hours=1)))


@pytest.fixture
def other_writer(tx_engine: BaseEngine) -> Iterator[sqlite3.Connection]:
    """A connection of its own holding SQLite's write lock, as another process would."""
    raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=0)
    yield raw
    if raw.in_transaction:
        raw.execute("ROLLBACK")
    raw.close()


def test_sqlite__a_transaction_that_raises_gives_the_write_lock_back(
    tx_engine: BaseEngine,
) -> None:
    with pytest.raises(RuntimeError), tx_engine._atomic():  # type: ignore[attr-defined]
        assert _lock().locked()
        raise RuntimeError("boom")

    assert not _lock().locked()
    assert not connection.in_atomic_block
    tx_engine.job_insert_many(TWO_JOBS)  # the next one gets it


def test_sqlite__a_begin_that_times_out_gives_the_write_lock_back(
    tx_engine: BaseEngine, other_writer: sqlite3.Connection
) -> None:
    with connection.cursor() as c:
        c.execute("PRAGMA busy_timeout = 10")
    other_writer.execute("BEGIN IMMEDIATE")

    with pytest.raises(DatabaseUnavailable):
        tx_engine.job_insert_many(TWO_JOBS)

    assert not _lock().locked()
    other_writer.execute("ROLLBACK")
    results = tx_engine.job_insert_many(TWO_JOBS)
    assert [r.duplicate for r in results] == [False, False]


def test_sqlite__a_call_inside_the_callers_transaction_takes_no_write_lock(
    tx_engine: BaseEngine,
) -> None:
    # The caller's BEGIN IMMEDIATE holds SQLite's lock already; were the engine to
    # wait for the process's lock too, this thread (which holds it) would never return.
    def insert_in_atomic() -> int:
        with transaction.atomic():
            return len(tx_engine.job_insert_many(TWO_JOBS))

    lock = _lock()
    lock.acquire()
    try:
        thread, out = _in_thread(insert_in_atomic)
        thread.join(GUARD)
    finally:
        lock.release()

    assert out == [2]


def test_sqlite__a_call_in_a_transaction_with_autocommit_off_takes_no_write_lock(
    tx_engine: BaseEngine,
) -> None:
    # With autocommit off (transaction.set_autocommit(False)) the caller's
    # transaction, which may hold SQLite's lock already, is the one the engine
    # writes in, as in atomic(): waiting for the process's lock there could wait
    # on a thread that waits for this one's commit.
    def insert_with_autocommit_off() -> int:
        transaction.set_autocommit(False)
        try:
            n = len(tx_engine.job_insert_many(TWO_JOBS))
            transaction.commit()
            return n
        finally:
            transaction.set_autocommit(True)

    lock = _lock()
    lock.acquire()
    try:
        thread, out = _in_thread(insert_with_autocommit_off)
        thread.join(GUARD)
    finally:
        lock.release()

    assert out == [2]


def test_sqlite__threads_queue_behind_one_that_waits_for_another_process(
    tx_engine: BaseEngine, other_writer: sqlite3.Connection
) -> None:
    client = _client(tx_engine)
    tx_engine.job_insert_many(
        [JobInsertParams(kind="k", queue="wl") for _ in range(4)], JobInsertOpts()
    )
    (done,) = tx_engine.job_claim(JobClaimParams(queue="wl", client_id=client, limit=1)).jobs
    other_writer.execute("BEGIN IMMEDIATE")  # another process writes

    # This process's claim waits in SQLite's busy handler, holding the process's
    # lock; its finalize queues on that lock. Both go through once the other commits.
    claim, claimed = _in_thread(
        lambda: tx_engine.job_claim(JobClaimParams(queue="wl", client_id=client, limit=3)).jobs
    )
    wait_for(lambda: _lock().locked(), GUARD)
    finalize, finalized = _in_thread(
        lambda: tx_engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[
                    JobFinalize(
                        id=done.id, attempted_by=client, fence=done.fence, state="completed"
                    )
                ]
            )
        )
    )
    wait_for(lambda: _waiters(_lock()) == 1, GUARD)
    assert not claimed and not finalized
    other_writer.execute("COMMIT")
    claim.join(GUARD)
    finalize.join(GUARD)

    assert len(claimed[0]) == 3
    assert [f.id for f in finalized[0]] == [done.id]
    assert not _lock().locked()
