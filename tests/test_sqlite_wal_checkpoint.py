"""The SQLite engine checkpoints the WAL after its own finalizes, outside the
process's write lock, then under it for what was committed meanwhile: the WAL
stays bounded by that alone (SQLite's automatic checkpoint turned off here) and
starts again after it, a finalize in the caller's transaction runs none, and a
checkpoint that fails leaves the finalize's result standing."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalizeParams,
    JobInsertParams,
)
from django_hopper.engine.sqlite import support
from django_hopper.types import JobState

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite engine specifics")

WAL_HEADER = 32
FRAME_HEADER = 24


def wal_frames_high_water() -> int:
    """Return the most frames the WAL file ever held since it was last truncated:
    SQLite starts a WAL again from its first frame without shrinking the file."""
    path = connection.settings_dict["NAME"] + "-wal"
    size = os.path.getsize(path) if os.path.exists(path) else 0
    page = connection.cursor().execute("PRAGMA page_size").fetchone()[0]
    return max(0, size - WAL_HEADER) // (FRAME_HEADER + page)


@pytest.fixture
def no_auto_checkpoint(tx_engine: BaseEngine) -> Iterator[BaseEngine]:
    """This thread's connection without SQLite's automatic checkpoint, its WAL
    emptied (the file truncated) and the engine's count of results started anew."""
    with connection.cursor() as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        c.execute("PRAGMA wal_autocheckpoint = 0")
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    support._UNCHECKPOINTED.clear()
    try:
        yield tx_engine
    finally:
        with connection.cursor() as c:
            c.execute("PRAGMA wal_autocheckpoint = 1000")
        support._UNCHECKPOINTED.clear()


def claim_and_finalize(engine: BaseEngine, client_id: int, batches: int, size: int) -> int:
    """Claim ``size`` jobs and finalize them as completed, ``batches`` times."""
    done = 0
    for _ in range(batches):
        claimed = engine.job_claim(JobClaimParams(queue="wal", client_id=client_id, limit=size))
        engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[
                    JobFinalize(
                        id=j.id, attempted_by=client_id, fence=j.fence, state=JobState.COMPLETED
                    )
                    for j in claimed.jobs
                ]
            )
        )
        done += len(claimed.jobs)
    return done


def register(engine: BaseEngine) -> int:
    return engine.client_register(
        ClientRegisterParams(hostname="wal", ttl=dt.timedelta(seconds=600))
    )


def insert(engine: BaseEngine, n: int) -> None:
    for start in range(0, n, 500):
        engine.job_insert_many(
            [JobInsertParams(kind="k", queue="wal") for _ in range(min(500, n - start))]
        )


def test_finalize__checkpoints_keep_the_wal_bounded_without_the_automatic_checkpoint(
    no_auto_checkpoint: BaseEngine,
) -> None:
    engine = no_auto_checkpoint
    client_id = register(engine)
    insert(engine, 6_000)
    with connection.cursor() as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the inserts' frames: not the subject

    # 600 claims and finalizes of 10: 6,000 results, twelve checkpoints' worth.
    assert claim_and_finalize(engine, client_id, batches=600, size=10) == 6_000

    # Without the engine's checkpoints the WAL holds every frame of the 1,200
    # transactions (several thousand); with them, what 500 results write, plus
    # the claims between a checkpoint and the next transaction.
    assert wal_frames_high_water() < 1_000


def test_finalize__runs_no_checkpoint_inside_the_callers_transaction(
    no_auto_checkpoint: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = no_auto_checkpoint
    client_id = register(engine)
    insert(engine, 20)
    monkeypatch.setattr(support, "CHECKPOINT_EVERY_RESULTS", 1)
    ran: list[str] = []
    connection.ensure_connection()
    connection.connection.set_trace_callback(ran.append)
    try:
        with transaction.atomic():
            claim_and_finalize(engine, client_id, batches=1, size=10)
        assert not [s for s in ran if "wal_checkpoint" in s]
        claim_and_finalize(engine, client_id, batches=1, size=10)  # its own transaction
        assert [s for s in ran if "wal_checkpoint" in s]
    finally:
        connection.connection.set_trace_callback(None)


class FailingConnection:
    """A sqlite3 connection whose checkpoint fails (another process holds the file)."""

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw
        self.failed = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if "wal_checkpoint" in sql:
            self.failed += 1
            raise sqlite3.OperationalError("disk I/O error")
        return self._raw.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def test_finalize__a_failed_checkpoint_leaves_the_finalize_applied(
    no_auto_checkpoint: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = no_auto_checkpoint
    client_id = register(engine)
    insert(engine, 10)
    claimed = engine.job_claim(JobClaimParams(queue="wal", client_id=client_id, limit=10))
    monkeypatch.setattr(support, "CHECKPOINT_EVERY_RESULTS", 1)
    wrapper = connections["default"]
    raw = wrapper.connection
    wrapper.connection = FailingConnection(raw)
    try:
        applied = engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[
                    JobFinalize(id=j.id, attempted_by=client_id, fence=j.fence, state="completed")
                    for j in claimed.jobs
                ]
            )
        )
        assert wrapper.connection.failed == 1  # the checkpoint was tried
    finally:
        wrapper.connection = raw

    assert len(applied) == 10
    assert all(engine.job_get(j.id).state == JobState.COMPLETED for j in claimed.jobs)


class CommitDuringCheckpoint:
    """A sqlite3 connection after whose first checkpoint another connection
    commits, as the producer's claim may while the completer copies frames."""

    def __init__(self, raw: sqlite3.Connection, path: str) -> None:
        self._raw = raw
        self._path = path
        self.checkpoints = 0

    def execute(self, sql: str, *args: Any) -> Any:
        cursor = self._raw.execute(sql, *args)
        if "wal_checkpoint" in sql:
            self.checkpoints += 1
            if self.checkpoints == 1:
                rows = cursor.fetchall()
                other = sqlite3.connect(self._path, isolation_level=None)
                other.execute("UPDATE hopper_job SET priority = priority WHERE queue = 'wal'")
                other.close()
                return _Rows(rows)
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchone(self) -> Any:
        return self._rows[0]


def test_finalize__frames_committed_during_the_checkpoint_are_copied_under_the_lock(
    no_auto_checkpoint: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = no_auto_checkpoint
    client_id = register(engine)
    insert(engine, 200)
    claimed = engine.job_claim(JobClaimParams(queue="wal", client_id=client_id, limit=100))
    monkeypatch.setattr(support, "CHECKPOINT_EVERY_RESULTS", 1)
    wrapper = connections["default"]
    raw = wrapper.connection
    wrapper.connection = CommitDuringCheckpoint(raw, wrapper.settings_dict["NAME"])
    try:
        engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[
                    JobFinalize(id=j.id, attempted_by=client_id, fence=j.fence, state="completed")
                    for j in claimed.jobs
                ]
            )
        )
        assert wrapper.connection.checkpoints == 2
    finally:
        wrapper.connection = raw

    # Everything was copied, the other connection's commit included, so the next
    # transaction starts the WAL again: it holds that transaction's frames alone.
    with connection.cursor() as c:
        c.execute("UPDATE hopper_job SET priority = priority WHERE queue = 'wal'")
        _, frames, _ = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert 0 < frames < 20
