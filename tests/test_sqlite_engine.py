"""What only the SQLite engine has to get right: the short lock wait, the
registered containment function, the stored time format, the batch statement
counts and the caller's transaction surviving a refused operation."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalizeParams,
    JobInsertOpts,
    JobInsertParams,
    JobListParams,
    JobRecordProgressParams,
    JobRetryParams,
    JobsMaintainParams,
)
from django_hopper.engine.sqlite.convert import db_time, json_contains
from django_hopper.engine.sqlite.support import Q
from django_hopper.exceptions import InvalidJob, JobLocked, UniqueConflict

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite engine specifics")


def _running(
    engine: BaseEngine, now: dt.datetime, n: int = 1, queue: str = "sq"
) -> tuple[int, list[Any]]:
    client = engine.client_register(ClientRegisterParams("h", dt.timedelta(hours=1), now=now))
    engine.job_insert_many(
        [JobInsertParams(kind="k", queue=queue) for _ in range(n)], JobInsertOpts(now=now)
    )
    jobs = engine.job_claim(JobClaimParams(queue=queue, client_id=client, limit=n, now=now)).jobs
    assert len(jobs) == n
    return client, jobs


@pytest.fixture
def other_writer(tx_engine: BaseEngine) -> Iterator[sqlite3.Connection]:
    """A second connection holding the write lock, as another process would."""
    raw = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=0)
    yield raw
    if raw.in_transaction:
        raw.execute("ROLLBACK")
    raw.close()


def _busy_timeout() -> int:
    with connection.cursor() as c:
        c.execute("PRAGMA busy_timeout")
        return int(c.fetchone()[0])


def test_sqlite__skip_locked_skips_every_job_while_another_transaction_writes(
    tx_engine: BaseEngine, other_writer: sqlite3.Connection
) -> None:
    now = tx_engine.now()
    client, (job,) = _running(tx_engine, now)
    before = _busy_timeout()
    other_writer.execute("BEGIN IMMEDIATE")

    applied = tx_engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[JobFinalize(id=job.id, attempted_by=client, fence=job.fence, state="completed")],
            skip_locked=True,
            now=now,
        )
    )

    assert applied == []
    assert _busy_timeout() == before
    other_writer.execute("ROLLBACK")
    assert tx_engine.job_get(job.id).state == "running"  # type: ignore[union-attr]


def test_sqlite__no_wait_progress_raises_job_locked_while_another_transaction_writes(
    tx_engine: BaseEngine, other_writer: sqlite3.Connection
) -> None:
    now = tx_engine.now()
    client, (job,) = _running(tx_engine, now)
    before = _busy_timeout()
    other_writer.execute("BEGIN IMMEDIATE")

    with pytest.raises(JobLocked):
        tx_engine.job_record_progress(
            JobRecordProgressParams(
                id=job.id,
                attempted_by=client,
                fence=job.fence,
                attempt=job.attempt,
                step="one",
                no_wait=True,
            )
        )

    assert _busy_timeout() == before


def test_sqlite__metadata_filter_works_on_a_reopened_connection(tx_engine: BaseEngine) -> None:
    now = tx_engine.now()
    tx_engine.job_insert_many(
        [JobInsertParams(kind="k", metadata={"a": {"b": [1, 2]}, "c": True})],
        JobInsertOpts(now=now),
    )
    connection.close()

    rows = tx_engine.job_list(JobListParams(metadata={"a": {"b": [2]}}))
    none = tx_engine.job_list(JobListParams(metadata={"c": 1}))

    assert len(rows) == 1
    assert none == []


@pytest.mark.parametrize(
    ("doc", "pattern", "expected"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True),
        ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, True),
        ({"a": [1, 2, 3]}, {"a": [3, 1]}, True),
        ({"a": [1, 2]}, {"a": [1, 4]}, False),
        ({"a": [[1, 2], [3]]}, {"a": [[2]]}, True),
        ({"a": [{"k": 1, "l": 2}]}, {"a": [{"k": 1}]}, True),
        ({"a": ["x"]}, {"a": "x"}, False),  # only a top-level array holds a scalar
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": True}, {"a": 1}, False),
        ({"a": None}, {"a": None}, True),
        ({}, {"a": None}, False),
        ({"a": "1"}, {"a": 1}, False),
        ({"a": 1}, {}, True),
    ],
)
def test_sqlite__json_contains_follows_postgres(doc: Any, pattern: Any, expected: bool) -> None:
    assert json_contains(doc, pattern) is expected


def test_sqlite__times_are_stored_with_six_fraction_digits(engine: BaseEngine) -> None:
    at = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    (result,) = engine.job_insert_many([JobInsertParams(kind="k")], JobInsertOpts(now=at))

    with connection.cursor() as c:
        c.execute(
            "SELECT CAST(created_at AS TEXT), CAST(scheduled_at AS TEXT) FROM hopper_job "
            "WHERE id = %s",
            [result.job.id.hex],
        )
        assert c.fetchone() == ("2030-01-02 03:04:05.000000", "2030-01-02 03:04:05.000000")
    assert db_time(at + dt.timedelta(hours=1, microseconds=7)) == "2030-01-02 04:04:05.000007"
    assert engine.job_get(result.job.id).created_at == at  # type: ignore[union-attr]


def test_sqlite__batches_take_a_fixed_number_of_statements(engine: BaseEngine) -> None:
    now = engine.now()
    n = 500
    with CaptureQueriesContext(connection) as inserted:
        results = engine.job_insert_many(
            [JobInsertParams(kind="k", queue="batch", unique_key=f"u{i % 400}") for i in range(400)]
            + [JobInsertParams(kind="k", queue="batch") for _ in range(n - 400)],
            JobInsertOpts(now=now),
        )
    assert len(results) == n and not any(r.duplicate for r in results)
    client = engine.client_register(ClientRegisterParams("h", dt.timedelta(hours=1), now=now))
    jobs = engine.job_claim(JobClaimParams(queue="batch", client_id=client, limit=n, now=now)).jobs
    assert len(jobs) == n
    finals = [
        JobFinalize(
            id=j.id,
            attempted_by=client,
            fence=j.fence,
            state=("completed", "retryable", "discarded", "scheduled")[i % 4],
            delay=dt.timedelta(seconds=5),
            snooze=i % 8 == 3,
            log="line\n",
        )
        for i, j in enumerate(jobs)
    ]
    with CaptureQueriesContext(connection) as finalized:
        applied = engine.job_finalize_many(JobFinalizeParams(jobs=finals, keep_logs=2, now=now))

    assert len(applied) == n
    assert len(inserted.captured_queries) <= 3
    assert len(finalized.captured_queries) <= 8
    assert sum(1 for j in finals if j.state in ("completed", "discarded")) == len(
        engine.job_list(JobListParams(states=("completed", "discarded"), limit=1000))
    )


def test_sqlite__a_refused_retry_leaves_the_callers_transaction_usable(
    engine: BaseEngine,
) -> None:
    now = engine.now()
    client, (job,) = _running(engine, now, queue="uq")
    engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[JobFinalize(id=job.id, attempted_by=client, fence=job.fence, state="discarded")],
            now=now,
        )
    )
    # The finished job had no unique key; give the next one a key a live job holds.
    engine.job_insert_many([JobInsertParams(kind="u", unique_key="x")], JobInsertOpts(now=now))
    client, (held,) = _running(engine, now, queue="uq2")
    with connection.cursor() as c:
        c.execute(
            "UPDATE hopper_job SET unique_key = 'x', kind = 'u2' WHERE id = %s", [held.id.hex]
        )
    engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[JobFinalize(id=held.id, attempted_by=client, fence=held.fence, state="canceled")],
            now=now,
        )
    )
    engine.job_insert_many([JobInsertParams(kind="u2", unique_key="x")], JobInsertOpts(now=now))

    with transaction.atomic():
        with pytest.raises(UniqueConflict):
            engine.job_retry(JobRetryParams(id=held.id, now=now))
        assert engine.job_get(held.id).state == "canceled"  # type: ignore[union-attr]


def test_sqlite__bad_input_names_the_field_and_writes_nothing(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob) as exc:
        engine.job_insert_many(
            [JobInsertParams(kind="ok"), JobInsertParams(kind="bad", priority=101)]
        )

    assert exc.value.field == "priority"
    assert engine.job_list(JobListParams(kinds=("ok",))) == []


def _statements(run: Any) -> list[str]:
    """Return the first word of each statement ``run()`` sent to SQLite, beside the
    transaction's own (BEGIN, COMMIT, savepoints)."""
    seen: list[str] = []
    connection.ensure_connection()
    raw = connection.connection
    raw.set_trace_callback(lambda sql: seen.append(sql.split(None, 1)[0].upper()))
    try:
        run()
    finally:
        raw.set_trace_callback(None)
    return [s for s in seen if s not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")]


def test_sqlite__a_claim_and_a_plain_finalize_take_two_statements_each(
    engine: BaseEngine,
) -> None:
    now = engine.now()
    client = engine.client_register(ClientRegisterParams("h", dt.timedelta(hours=1), now=now))
    engine.job_insert_many(
        [JobInsertParams(kind="k", queue="st") for _ in range(10)], JobInsertOpts(now=now)
    )
    claimed: list[Any] = []

    def claim() -> None:
        params = JobClaimParams(queue="st", client_id=client, limit=10, now=now)
        claimed.extend(engine.job_claim(params).jobs)

    assert _statements(claim) == ["UPDATE", "WITH"]  # promote due jobs, claim
    finals = [
        JobFinalize(id=j.id, attempted_by=client, fence=j.fence, state="completed") for j in claimed
    ]
    applied: list[Any] = []

    def finalize() -> None:
        params = JobFinalizeParams(jobs=finals, no_batches=True, now=now)
        applied.extend(engine.job_finalize_many(params))

    # To history, out of the live table; nothing waits again, so no third statement.
    assert _statements(finalize) == ["INSERT", "DELETE"]
    assert len(applied) == 10
    assert len(engine.job_list(JobListParams(states=("completed",), limit=100))) == 10


def test_sqlite__an_execute_wrapper_still_sees_the_hot_statements(engine: BaseEngine) -> None:
    now = engine.now()
    seen: list[str] = []

    def observe(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(observe):
        client, jobs = _running(engine, now, n=2, queue="seen")
        engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[
                    JobFinalize(id=j.id, attempted_by=client, fence=j.fence, state="completed")
                    for j in jobs
                ],
                now=now,
            )
        )
    assert any("INSERT INTO hopper_job (" in s for s in seen)
    assert any("UPDATE hopper_job" in s and "RETURNING" in s for s in seen)
    assert any("DELETE FROM hopper_job" in s for s in seen)


@pytest.mark.parametrize(
    "text",
    [
        "0123456789abcdef0123456789ABCDEF",
        "0x23456789abcdef0123456789abcdef",
        " 123456789abcdef0123456789abcdef",
        "0123456789abcdef 123456789abcdef",
        "g123456789abcdef0123456789abcdef",
        "{0123456789abcdef0123456789abcdef}",
        "0123456789abcdef",
    ],
)
def test_sqlite__stored_uuids_parse_as_uuid_does(text: str) -> None:
    import uuid

    from django_hopper.engine.sqlite.convert import from_db_uuid

    try:
        expected: Any = uuid.UUID(text)
    except ValueError:
        with pytest.raises(ValueError):
            from_db_uuid(text)
        return
    parsed = from_db_uuid(text)
    assert (parsed, parsed.int, str(parsed), hash(parsed), parsed.is_safe) == (
        expected,
        expected.int,
        str(expected),
        hash(expected),
        expected.is_safe,
    )


def test_sqlite__a_stored_time_parses_to_aware_utc_each_time() -> None:
    from django_hopper.engine.sqlite.convert import from_db_time

    for _ in range(2):  # parsed, then remembered
        assert from_db_time("2030-01-02 03:04:05.000006") == dt.datetime(
            2030, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC
        )
        assert from_db_time("2030-01-02 04:04:05.000006+01:00") == dt.datetime(
            2030, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC
        )
    assert from_db_time(dt.datetime(2030, 1, 2)) == dt.datetime(2030, 1, 2, tzinfo=dt.UTC)


@pytest.mark.parametrize("depends_on", [None, '["00"]'])
def test_sqlite__the_workflow_sweep_reads_only_pending_jobs(
    engine: BaseEngine, depends_on: str | None
) -> None:
    """The sweep runs every second under the write lock: its cost must follow the
    pending jobs, never the whole live table (SQLite would walk it in ID order)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute(
            "EXPLAIN QUERY PLAN " + Q["workflow_promote_ready"],
            {"depends_on": depends_on, "after": "", "limit": 1000},
        )
        plan = [row[-1] for row in cursor.fetchall()]
    assert "SEARCH j USING INDEX hopper_job_state (state=?)" in plan
    assert not any(line == "SCAN j" or line.startswith("SCAN j USING") for line in plan)


# -- live-table upkeep: statistics refreshed only when stale -------------------

#: sqlite_stat1 of hopper_job as ANALYZE writes it with 10^6 waiting jobs: half
#: available in another queue, half scheduled in the claimed one, 1,000 available
#: in it, nothing running, keyed, leased or expiring (empty indexes: "0 ...").
STATS_AT_A_MILLION = {
    "hopper_job_claim": "501000 250500 250500 250500 1",
    "hopper_job_state": "1001000 500500 333667 1",
    "hopper_job_kind": "1001000 1001000 1",
    "hopper_job_due": "500000 500000 500000",
    "sqlite_autoindex_hopper_job_1": "1001000 1",
    "hopper_job_unique_key": "0 0 0",
    "hopper_job_running": "0 0 0",
    "hopper_job_expires": "0 0",
    "hopper_job_lease": "0 0",
    "hopper_job_batch": "0 0",
    "hopper_job_ordering": "0 0 0 0",
    "hopper_job_keyed": "0 0 0 0 0",
    "hopper_job_subject": "0 0",
}


def _stats(table: str = "hopper_job") -> dict[str, str]:
    with connection.cursor() as c:
        c.execute("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'")
        if not c.fetchone()[0]:
            return {}
        c.execute("SELECT idx, stat FROM sqlite_stat1 WHERE tbl = %s", [table])
        return dict(c.fetchall())


def _insert(engine: BaseEngine, n: int, queue: str = "up", **fields: Any) -> None:
    engine.job_insert_many(
        [JobInsertParams(kind="k", queue=queue, **fields) for _ in range(n)], JobInsertOpts()
    )


def test_sqlite__upkeep_analyzes_only_when_the_row_estimate_is_stale(engine: BaseEngine) -> None:
    """ANALYZE reads the whole table under the write lock, so upkeep runs it only
    when the rows sqlite_stat1 holds are off by analyze_ratio: once as the table
    grows tenfold, never again while it stays."""
    _forget_statistics()  # rolled back with the test
    params = JobsMaintainParams(analyze_min_rows=50, analyze_ratio=10.0)
    assert not engine.jobs_maintain(params).analyzed  # empty: nothing to learn
    _insert(engine, 60)

    first = engine.jobs_maintain(params)
    after_first = _stats()
    again = [engine.jobs_maintain(params).analyzed for _ in range(3)]
    _insert(engine, 300)  # 360 rows: off by 6x, not stale yet
    below = engine.jobs_maintain(params)
    _insert(engine, 300)  # 660 rows: off by 11x
    grown = engine.jobs_maintain(params)

    assert first.analyzed and first.tables == {"hopper_job": "analyzed"}
    assert after_first["sqlite_autoindex_hopper_job_1"].split()[0] == "60"
    assert again == [False, False, False]
    assert not below.analyzed and below.tables == {}
    assert grown.analyzed
    assert _stats()["sqlite_autoindex_hopper_job_1"].split()[0] == "660"


def test_sqlite__an_index_found_empty_gets_the_row_of_an_empty_index(engine: BaseEngine) -> None:
    """SQLite 3.40 writes no sqlite_stat1 row for an empty index (newer versions
    write "0 ..."): upkeep writes that row, so the planner sees the same
    statistics on every version and never takes the table for unanalyzed."""
    _forget_statistics()  # rolled back with the test
    _insert(engine, 60)
    assert engine.jobs_maintain(JobsMaintainParams(analyze_min_rows=50)).analyzed

    stats = _stats()
    with connection.cursor() as c:
        c.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'hopper_job'")
        indexes = {row[0] for row in c.fetchall()}
    assert set(stats) == indexes
    assert stats["hopper_job_running"] == "0 0 0"  # (state='running'; attempted_by, id)
    assert stats["hopper_job_claim"].split()[0] == "60"


def _plan(name: str, **args: Any) -> list[str]:
    params = {
        "queue": "sq",
        "limited": False,
        "client_id": 1,
        "now": db_time(dt.datetime.now(dt.UTC)),
        "scan": 10,
        "partition_limit": 0,
        "free": 10,
        "limit": 10,
        **args,
    }
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + Q[name], params)
        return [row[-1] for row in cursor.fetchall()]


@pytest.mark.parametrize("rows", [0, 1_000, 1_000_000])
def test_sqlite__the_claim_plan_holds_at_any_table_size(engine: BaseEngine, rows: int) -> None:
    """With no statistics (0 rows), with those upkeep takes at 1,000 rows, and
    with those ANALYZE takes at 10^6 (written to sqlite_stat1 as it wrote them),
    the claim reads the queue's claim index and its promotion the queue's due
    range; nothing scans the table."""
    _forget_statistics()  # rolled back with the test
    if rows == 1_000:
        _insert(engine, 500, queue="other")
        _insert(engine, 500, queue="sq", scheduled_at=dt.datetime.now(dt.UTC) + dt.timedelta(1))
        assert engine.jobs_maintain(JobsMaintainParams()).analyzed
    if rows == 1_000_000:
        with connection.cursor() as c:
            c.execute("ANALYZE hopper_queue")  # creates sqlite_stat1
            c.execute("DELETE FROM sqlite_stat1 WHERE tbl = 'hopper_job'")
            for idx, stat in STATS_AT_A_MILLION.items():
                c.execute("INSERT INTO sqlite_stat1 VALUES ('hopper_job', %s, %s)", [idx, stat])
            c.execute("ANALYZE sqlite_master")  # the planner reads them again

    claim, keyless = _plan("job_claim"), _plan("job_claim.keyless")
    promote = _plan("job_claim.promote")

    for plan in (claim, keyless):
        assert "SEARCH hopper_job USING INDEX hopper_job_claim (queue=?)" in plan
    assert promote == ["SEARCH hopper_job USING INDEX hopper_job_due (queue=? AND scheduled_at<?)"]
    assert not any(line.startswith("SCAN hopper_job") for line in claim + keyless + promote)


def test_sqlite__upkeep_keeps_the_statistics_of_a_drained_table(engine: BaseEngine) -> None:
    """A queue drained from 10^6 jobs to none is not analyzed: an ANALYZE of the
    empty table would write zero counts ("0 ..." for every index, a table of
    one row to the planner), and the claim would plan from them as the table
    fills again. Its statistics stay until it holds analyze_min_rows rows."""
    _forget_statistics()
    try:
        with connection.cursor() as c:
            c.execute("ANALYZE hopper_queue")  # creates sqlite_stat1
            c.execute("DELETE FROM sqlite_stat1 WHERE tbl = 'hopper_job'")
            for idx, stat in STATS_AT_A_MILLION.items():
                c.execute("INSERT INTO sqlite_stat1 VALUES ('hopper_job', %s, %s)", [idx, stat])
            c.execute("ANALYZE sqlite_master")

        drained = engine.jobs_maintain(JobsMaintainParams())
        _insert(engine, 600, queue="sq")  # refilling, still below analyze_min_rows
        refilling = engine.jobs_maintain(JobsMaintainParams())
        kept = _stats()
        claim, promote = _plan("job_claim"), _plan("job_claim.promote")
        _insert(engine, 600, queue="sq")  # 1,200 rows: off by 800x, analyzed
        refilled = engine.jobs_maintain(JobsMaintainParams())

        assert (drained.analyzed, drained.tables) == (False, {})
        assert (refilling.analyzed, refilling.tables) == (False, {})
        assert kept == STATS_AT_A_MILLION
        assert "SEARCH hopper_job USING INDEX hopper_job_claim (queue=?)" in claim
        assert not any(line.startswith("SCAN hopper_job") for line in claim + promote)
        assert refilled.analyzed
        assert _stats()["sqlite_autoindex_hopper_job_1"].split()[0] == "1200"
    finally:
        _forget_statistics()  # sqlite_stat1 may outlive the test's rollback


def _forget_statistics() -> None:
    """Drop what committed ANALYZEs of earlier tests left (the file outlives them)."""
    if _stats() or _stats("hopper_job_dependency") or _stats("hopper_batch_progress"):
        with connection.cursor() as c:
            c.execute("DELETE FROM sqlite_stat1")
            c.execute("ANALYZE sqlite_master")


def test_sqlite__upkeep_does_not_wait_for_a_writer(
    tx_engine: BaseEngine, other_writer: sqlite3.Connection
) -> None:
    _forget_statistics()
    _insert(tx_engine, 60)
    params = JobsMaintainParams(analyze_min_rows=50)
    before = _busy_timeout()
    other_writer.execute("BEGIN IMMEDIATE")
    try:
        locked = tx_engine.jobs_maintain(params)
        other_writer.execute("ROLLBACK")
        assert _busy_timeout() == before
        assert not locked.analyzed
        assert locked.tables["hopper_job"].startswith("failed: database is locked")
        assert "hopper_job" not in _stats()
        assert tx_engine.jobs_maintain(params).analyzed  # the next pass
    finally:
        _forget_statistics()  # later tests plan without these statistics
