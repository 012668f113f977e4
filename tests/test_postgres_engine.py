"""PostgreSQL-only behaviour of the engine that the shared conformance suite
does not reach: COPY, plans, lock handling inside a caller's transaction,
races on unique keys with history, error translation and the listener.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction
from psycopg import IsolationLevel
from psycopg.pq import TransactionStatus

from bench.roundtrips import count
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobInsertOpts,
    JobInsertParams,
    JobListParams,
    JobRecordProgressParams,
    JobRetryParams,
)
from django_hopper.engine.postgres import convert, support
from django_hopper.engine.postgres.support import QUERIES, raw_query
from django_hopper.exceptions import (
    DatabaseError,
    DatabaseUnavailable,
    InvalidJob,
    JobLocked,
    UniqueConflict,
)
from django_hopper.ids import new_ids
from django_hopper.types import CHANNEL_INSERT, JobRow
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    claim,
    finalize,
    get,
    insert,
    receive,
    register,
    result,
    running,
)

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL engine only")


@contextmanager
def other_connection() -> Iterator[psycopg.Connection[Any]]:
    """A second session on the test database, outside Django, for holding locks."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context"):
        params.pop(key, None)
    conn = psycopg.connect(**params)
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


# -- COPY --------------------------------------------------------------------


def test_copy__inserts_rows_that_read_back_as_returned(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    later = db_now + HOUR
    params = [
        JobInsertParams(kind="tests.copy", args={"n": i}, tags=("a", "b"), metadata={"m": i})
        for i in range(50)
    ]
    params.append(JobInsertParams(kind="tests.copy", scheduled_at=later, ttl=2 * HOUR))
    results = engine.job_insert_copy(params, JobInsertOpts(now=db_now))

    assert [r.job.state for r in results] == ["available"] * 50 + ["scheduled"]
    assert all(not r.duplicate for r in results)
    for r in results:
        stored = get(engine, r.job.id)
        assert stored == r.job
    assert results[-1].job.expires_at == db_now + 2 * HOUR
    assert results[-1].job.scheduled_at == later


def test_copy__refuses_unique_keys_before_writing(engine: BaseEngine, db_now: dt.datetime) -> None:
    params = [
        JobInsertParams(kind="tests.copy"),
        JobInsertParams(kind="tests.copy", unique_key="k"),
    ]
    with pytest.raises(InvalidJob) as info:
        engine.job_insert_copy(params, JobInsertOpts(now=db_now))
    assert info.value.field == "unique_key"


def test_insert_values__are_insert_arrays_element_for_one_job() -> None:
    """The one-job insert sends the same columns and values as a batch of one."""
    job_id = new_ids(1)[0]
    p = JobInsertParams(
        kind="tests.values",
        queue="q",
        priority=3,
        max_attempts=4,
        scheduled_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        args={"a": 1},
        metadata={"m": "x"},
        tags=("t",),
        ordering_key="o",
        partition_key="pk",
        batch_id=new_ids(1)[0],
        ttl=dt.timedelta(minutes=5),
        awaited=True,
        id=job_id,
        subject="s",
    )
    arrays = convert.insert_arrays([p], [job_id])
    assert convert.insert_values(p, job_id) == {k: v[0] for k, v in arrays.items()}


# -- plans -------------------------------------------------------------------


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("name", ["job_claim", "job_claim.keyless"])
def test_claim__plan_uses_the_partial_indexes(
    engine: BaseEngine, db_now: dt.datetime, name: str, keyed: bool
) -> None:
    """Many future and foreign jobs must not turn the claim into a scan, nor
    many keyed candidates the keyless path's probe for one (an EXISTS over
    them would read the table until it met the first)."""
    far = db_now + 24 * HOUR
    if keyed:
        engine.job_insert_many(
            [
                JobInsertParams(kind="tests.plan", queue=queue, ordering_key=f"k{i % 50}")
                for queue in ("default", "other")
                for i in range(1000)
            ],
            JobInsertOpts(now=db_now),
        )
    engine.job_insert_copy(
        [JobInsertParams(kind="tests.plan", scheduled_at=far) for _ in range(3000)]
        + [JobInsertParams(kind="tests.plan", queue="other") for _ in range(3000)],
        JobInsertOpts(now=db_now),
    )
    insert(engine, db_now, kind="tests.plan")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE hopper_job")
        from django_hopper.engine.postgres.support import QUERIES

        cursor.execute(
            "EXPLAIN " + QUERIES[name],
            {
                "queue": "default",
                "client_id": 1,
                "limit": 10,
                "now": db_now,
                "limited": False,
                "partition_limit": 0,
                "scan": 10,
                "free": 10,
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "hopper_job_claim" in plan
    assert "hopper_job_due" in plan
    assert "Seq Scan on hopper_job" not in plan
    if name == "job_claim.keyless":
        assert "hopper_job_keyed" in plan  # the probe for keyed candidates


@pytest.mark.parametrize(("tags_any", "tags_all"), [(["rare"], None), (None, ["rare", "x"])])
def test_list__tag_filter_plan_uses_the_partial_tags_index(
    engine: BaseEngine, db_now: dt.datetime, tags_any: Any, tags_all: Any
) -> None:
    """hopper_job_tags holds tagged jobs only (untagged ones cost a claim and a
    finalize no GIN write); a tag filter repeats its predicate, so it is used."""
    engine.job_insert_copy(
        [JobInsertParams(kind="tests.plan") for _ in range(5000)]
        + [JobInsertParams(kind="tests.plan", tags=("common",)) for _ in range(500)]
        + [JobInsertParams(kind="tests.plan", tags=("rare", "x")) for _ in range(3)],
        JobInsertOpts(now=db_now),
    )
    params = {
        "live": True,
        "history": False,
        "queue": None,
        "kinds": None,
        "states": None,
        "ordering_key": None,
        "after": None,
        "ids": None,
        "priorities": None,
        "tags_any": tags_any,
        "tags_all": tags_all,
        "metadata": None,
        "limit": 100,
    }
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE hopper_job")
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'hopper_job' AND indexdef ~ 'tags'"
        )
        assert [r[0] for r in cursor.fetchall()] == [
            "CREATE INDEX hopper_job_tags ON public.hopper_job USING gin (tags)"
            " WHERE (tags <> '[]'::jsonb)"
        ]
        cursor.execute("EXPLAIN " + QUERIES["job_list"], params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "hopper_job_tags" in plan
    assert "Seq Scan on hopper_job " not in plan

    found = engine.job_list(JobListParams(tags_any=tags_any or (), tags_all=tags_all or ()))
    assert len(found) == 3


def test_schedule__plan_reads_due_jobs_per_queue_and_updates_by_key(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    """The leader's sweep must not grow with the jobs waiting for a later time:
    each queue's due jobs are a range of hopper_job_due, and the update finds its
    rows by primary key, never by hashing the live table."""
    far = db_now + 24 * HOUR
    engine.job_insert_copy(
        [JobInsertParams(kind="tests.plan", queue=q, scheduled_at=far) for q in ("qa", "qb")] * 1500
        + [JobInsertParams(kind="tests.plan", queue="other") for _ in range(3000)],
        JobInsertOpts(now=db_now),
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE hopper_job")
        cursor.execute(
            "EXPLAIN " + QUERIES["job_schedule"], {"queue": None, "limit": 10_000, "now": db_now}
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "hopper_job_due" in plan
    assert "Cond: (((queue)::text = q" in plan  # one queue's range at a time
    assert "hopper_job_pkey" in plan
    assert "Seq Scan on hopper_job" not in plan
    assert "Hash Join" not in plan


def test_claim__unlimited_claim_settles_on_a_generic_plan(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    """The hot claim is planned once per connection, not on every call: with
    ``LIMIT $n`` PostgreSQL would keep planning it for its parameters."""
    engine.job_insert_copy(
        [JobInsertParams(kind="tests.plan", queue="generic") for _ in range(20000)],
        JobInsertOpts(now=db_now),
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE hopper_job")
    client_id = register(engine, db_now)
    for _ in range(8):
        insert(engine, db_now, kind="tests.plan", queue="generic")
        claim(engine, client_id, db_now, queue="generic", limit=10)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s AND statement NOT LIKE %s",
            ["%gate AS%", "%partition_running%"],
        )
        rows = cursor.fetchall()
    assert rows, "the claim ran as a prepared statement"
    generic, custom = rows[0]
    assert generic >= 1
    assert custom <= 5


def test_producer__warm_up_plans_its_claim_so_the_first_job_reuses_the_generic_plan(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    """A new worker's first pickups do not pay for preparing and planning the claim:
    the producer ran it at start with no client, which claimed nothing."""
    from types import SimpleNamespace

    from django_hopper.worker.producer import WARM_CLAIM_RUNS, Producer

    job = insert(engine, db_now, kind="tests.plan", queue="warm")
    started: list[JobRow] = []
    control: Any = SimpleNamespace(
        may_claim_from=lambda queue: True,
        client_id=register(engine, db_now),
        limited_queues=set(),
    )
    producer = Producer(
        "warm", 2, engine=engine, control=control,
        start_job=lambda j, _producer: started.append(j),
        poll_interval=1.0, claim_debounce=0.0, ahead=4,
    )  # fmt: skip

    assert producer.warm_up() == 2 * WARM_CLAIM_RUNS  # the free slots, and with room ahead
    assert get(engine, job.id).state == "available"  # nothing read, locked or claimed

    assert producer.claim_once() == 1  # the free slots' statement: planned already
    assert [j.id for j in started] == [job.id]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s AND statement LIKE %s",
            ["%keys AS%", "%LIMIT 2%"],
        )
        rows = cursor.fetchall()
    assert rows == [(1, WARM_CLAIM_RUNS)]


@pytest.mark.parametrize("name", ["job_finalize_many", "job_finalize_many.completed"])
def test_finalize__probes_the_primary_key_whatever_the_number_running(
    engine: BaseEngine, db_now: dt.datetime, name: str
) -> None:
    """A finalize of a few results must not walk every running job of the cluster,
    even when the statistics were taken while nothing ran."""
    engine.job_insert_copy(
        [JobInsertParams(kind="tests.plan", queue="idle") for _ in range(3000)],
        JobInsertOpts(now=db_now),
    )
    for _ in range(200):
        insert(engine, db_now, kind="tests.plan", queue="many")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE hopper_job")  # nothing runs yet
    client_id = register(engine, db_now)
    claimed = claim(engine, client_id, db_now, queue="many", limit=200)
    assert len(claimed) == 200
    text, names = raw_query(QUERIES[name])
    given = {
        "id": f"ARRAY['{claimed[0].id}']::uuid[]",
        "attempted_by": f"ARRAY[{int(client_id)}]::int8[]",
        "fence": f"ARRAY[{int(claimed[0].fence)}]::int8[]",
    }
    placeholders = ", ".join(given.get(n, "NULL") for n in names)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("PREPARE fin AS " + text.decode().replace("%", "%%"))
        cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE fin({placeholders})")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE fin")
        transaction.set_rollback(True)
    lines = plan.splitlines()
    walks = [
        line
        for line, cond in itertools.pairwise(lines)
        if "hopper_job_state" in line and "running" in cond
    ]
    assert walks == []  # no range scan over the running jobs
    assert "Seq Scan on hopper_job " not in plan
    assert "rows=200" not in plan


def test_finalize__a_large_batch_is_planned_for_its_values_a_small_one_once(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    """The generic plan estimates the results at ten rows and compares each job with
    every result; a large batch goes unnamed, so it is planned for its own size."""
    client_id = register(engine, db_now)
    for i in range(40):
        insert(engine, db_now, kind="tests.plan", queue=f"large-{i}")
    large = [claim(engine, client_id, db_now, queue=f"large-{i}")[0] for i in range(40)]

    def prepared() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ["%INSERT INTO hopper_job_history%"],
            )
            return int(cursor.fetchone()[0])

    before = prepared()
    applied = finalize(engine, db_now, *[result(j, "completed") for j in large], no_batches=True)
    assert len(applied) == 40
    assert prepared() == before
    small = running(engine, client_id, db_now)
    finalize(engine, db_now, result(small, "completed"), no_batches=True)
    assert prepared() == before + 1


# -- locks inside the caller's transaction ------------------------------------


def test_progress__no_wait_keeps_the_callers_transaction_usable(
    tx_engine: BaseEngine,
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    job = running(tx_engine, client_id, now)
    params = JobRecordProgressParams(
        id=job.id, attempted_by=client_id, fence=job.fence, attempt=job.attempt, step="s",
        no_wait=True, now=now,
    )  # fmt: skip
    with other_connection() as other:
        other.execute("SELECT 1 FROM hopper_job WHERE id = %s FOR UPDATE", (job.id,))
        with transaction.atomic():
            with pytest.raises(JobLocked):
                tx_engine.job_record_progress(params)
            # The refused lock rolled back to a savepoint only.
            assert tx_engine.job_get(job.id) is not None
    progress = tx_engine.job_record_progress(params)
    assert progress is not None and progress.step == "s"


def test_retry__unique_conflict_keeps_the_callers_transaction_usable(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    client_id = register(engine, db_now)
    job = running(engine, client_id, db_now, unique_key="u1")
    finalize(engine, db_now, result(job, "discarded"))
    insert(engine, db_now, unique_key="u1")
    with pytest.raises(UniqueConflict):
        engine.job_retry(JobRetryParams(id=job.id, now=db_now))
    # The test runs inside an atomic block: it must still work.
    assert get(engine, job).state == "discarded"


# -- unique keys and history ---------------------------------------------------


def test_insert__finds_a_holder_finalized_while_the_insert_waits(tx_engine: BaseEngine) -> None:
    """The holder is finalized (to history) by a transaction the insert waits for."""
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    holder = running(tx_engine, client_id, now, unique_key="race")
    started = threading.Event()
    out: dict[str, Any] = {}

    def insert_duplicate() -> None:
        try:
            started.set()
            (res,) = tx_engine.job_insert_many(
                [
                    JobInsertParams(
                        kind="tests.job", unique_key="race", unique_finished=("completed",)
                    )
                ],
                JobInsertOpts(now=now),
            )
            out["result"] = res
        except BaseException as exc:  # pragma: no cover - reported below
            out["error"] = exc
        finally:
            connections.close_all()

    with transaction.atomic():
        finalize(tx_engine, now, result(holder, "completed"))
        thread = threading.Thread(target=insert_duplicate)
        thread.start()
        started.wait(5)
        thread.join(0.5)  # the insert now waits on the holder's row lock
    thread.join(10)
    assert "error" not in out, out.get("error")
    assert out["result"].duplicate
    assert out["result"].job.id == holder.id
    assert out["result"].job.state == "completed"
    assert get(tx_engine, holder).state == "completed"


# -- input errors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"priority": 101}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"queue": ""}, "queue"),
        ({"scheduled_at": dt.datetime(2030, 1, 1)}, "scheduled_at"),
        ({"args": {"x": object()}}, "args"),
        ({"unique_finished": ("running",)}, "unique_finished"),
    ],
)
def test_insert__refuses_bad_input_before_writing(
    engine: BaseEngine, db_now: dt.datetime, fields: dict[str, Any], field: str
) -> None:
    good = JobInsertParams(kind="tests.job")
    with pytest.raises(InvalidJob) as info:
        engine.job_insert_many([good, JobInsertParams(kind="tests.job", **fields)])
    assert info.value.field == field
    assert claim(engine, register(engine, db_now), db_now) == []


# -- listener ------------------------------------------------------------------


def test_listener__insert_notify_reaches_a_listener(tx_engine: BaseEngine) -> None:
    listener = tx_engine.listener()
    try:
        listener.listen([CHANNEL_INSERT])
        tx_engine.job_insert_copy(
            [JobInsertParams(kind="tests.job", queue="lq")], JobInsertOpts(notify=True)
        )
        got = receive(listener, 1)
        assert [(n.channel, n.payload) for n in got] == [(CHANNEL_INSERT, "lq")]
        assert listener.next(0.05) == []
    finally:
        listener.close()


def test_listener__a_unique_insert_notifies_only_for_jobs_it_inserted(
    tx_engine: BaseEngine,
) -> None:
    listener = tx_engine.listener()
    try:
        listener.listen([CHANNEL_INSERT])
        opts = JobInsertOpts(notify=True)
        first = JobInsertParams(kind="tests.job", queue="uq", unique_key="k")
        tx_engine.job_insert_many([first], opts)
        assert [(n.channel, n.payload) for n in receive(listener, 1)] == [(CHANNEL_INSERT, "uq")]
        again = tx_engine.job_insert_many([first], opts)
        assert again[0].duplicate
        assert listener.next(0.05) == []  # a duplicate wakes nobody
    finally:
        listener.close()


def test_raw_query__numbers_named_placeholders_once_each() -> None:
    text, names = raw_query("SELECT %(a)s::int, %(b)s::text, %(a)s::int, 'x%%'")
    assert text == b"SELECT $1::int,$2::text,$1::int,'x%'"
    assert names == ("a", "b")


def test_prepared_cursor__is_kept_for_its_connection_and_replaced_after_a_reconnect(
    tx_engine: BaseEngine,
) -> None:
    first = tx_engine._prepared_cursor()  # type: ignore[attr-defined]
    assert first is not None
    assert tx_engine._prepared_cursor() is first  # type: ignore[attr-defined]
    connection.close()
    again = tx_engine._prepared_cursor()  # type: ignore[attr-defined]
    assert again is not None and again is not first
    assert again.connection is connection.connection
    tx_engine.job_insert_many([JobInsertParams(kind="tests.job", queue="rc")])


def test_enqueue__is_one_statement_in_a_transaction_and_one_round_trip_alone(
    tx_engine: BaseEngine,
) -> None:
    insert_one = JobInsertParams(kind="tests.job", queue="rt")
    tx_engine.job_insert_many([insert_one])  # prepares the statement

    def in_atomic() -> None:
        with transaction.atomic():
            tx_engine.job_insert_many([insert_one])

    keys = iter(range(1_000))

    def unique_in_atomic() -> None:
        with transaction.atomic():
            p = JobInsertParams(kind="tests.job", queue="rt", unique_key=f"k{next(keys)}")
            tx_engine.job_insert_many([p], JobInsertOpts(notify=True))

    unique_in_atomic()
    in_atomic()  # prepares the statement that carries the BEGIN
    alone = count(lambda: tx_engine.job_insert_many([insert_one]))
    framed = count(in_atomic)
    unique = count(unique_in_atomic)
    assert (alone["round_trips"], alone["simple"]) == (1, [])
    # The insert that opens the transaction carries its BEGIN.
    assert framed["round_trips"] == 2
    assert framed["simple"][0].startswith("BEGIN;EXECUTE hopper_")
    assert framed["simple"][1:] == ["COMMIT"]
    # The wake-up is part of the insert, not a statement of its own; the
    # unique insert carries the BEGIN too.
    assert unique["round_trips"] == 2
    assert unique["simple"][0].startswith("BEGIN;EXECUTE hopper_")
    assert unique["simple"][1:] == ["COMMIT"]


def test_enqueue__an_insert_carrying_its_begin_commits_and_rolls_back_with_the_caller(
    tx_engine: BaseEngine,
) -> None:
    def ids() -> set[Any]:
        with connection.cursor() as cur:
            cur.execute("SELECT id FROM hopper_job WHERE queue = 'cb'")
            return {row[0] for row in cur.fetchall()}

    p = JobInsertParams(kind="tests.job", queue="cb", priority=3, ttl=dt.timedelta(seconds=90))
    with transaction.atomic():
        kept = tx_engine.job_insert_many([p])[0].job
        assert connection.connection.info.transaction_status == TransactionStatus.INTRANS
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = tx_engine.job_insert_many([p])[0].job
        raise RuntimeError
    assert ids() == {kept.id} and dropped.id != kept.id
    read = tx_engine.job_get(kept.id)
    assert read is not None
    assert (read.state, read.priority, read.expires_at) == (
        kept.state,
        3,
        kept.created_at + dt.timedelta(seconds=90),
    )
    assert (kept.scheduled_at, kept.expires_at) == (read.scheduled_at, read.expires_at)


@pytest.mark.parametrize("unique_key", [None, "k'1"])
def test_enqueue__every_value_survives_the_literals_of_an_insert_carrying_its_begin(
    tx_engine: BaseEngine, unique_key: str | None
) -> None:
    db_now = tx_engine.now()
    p = JobInsertParams(
        kind="tests.job",
        queue="lit",
        priority=-7,
        max_attempts=40_000,
        scheduled_at=db_now + dt.timedelta(hours=2, microseconds=17),
        args={"args": ["it's", 'a "q"', "\\x", None, 1.5], "kwargs": {"ü": [True]}},
        metadata={"k": "v'"},
        tags=("a", "b'"),
        unique_key=unique_key,
        ordering_key="o'k",
        partition_key="p",
        ttl=dt.timedelta(days=3, seconds=5),
        awaited=True,
        subject="s'1",
    )
    done: list[JobRow] = []

    def in_atomic() -> None:
        with transaction.atomic():
            done.append(tx_engine.job_insert_many([p], JobInsertOpts(notify=True))[0].job)

    assert count(in_atomic)["simple"][0].startswith("PREPARE hopper_")
    inserted = done[0]
    read = tx_engine.job_get(inserted.id)
    assert read == inserted
    assert (read.priority, read.max_attempts, read.args, read.tags, read.subject) == (
        -7,
        40_000,
        p.args,
        ["a", "b'"],
        "s'1",
    )
    assert read.scheduled_at == p.scheduled_at and read.state == "scheduled"


def test_enqueue__a_statement_deallocated_under_it_is_prepared_again(
    tx_engine: BaseEngine,
) -> None:
    p = JobInsertParams(kind="tests.job", queue="dealloc")

    def in_atomic() -> JobRow:
        with transaction.atomic():
            return tx_engine.job_insert_many([p])[0].job

    tx_engine.job_insert_many([p])  # a statement psycopg prepared, as a worker's are
    first = count(in_atomic)  # prepares in the same round trip
    assert first["round_trips"] == 2 and first["simple"][0].startswith("PREPARE hopper_")
    # psycopg deallocates every prepared statement when it rolls back.
    with pytest.raises(RuntimeError), transaction.atomic():
        tx_engine.job_insert_many([p])
        raise RuntimeError
    again = count(in_atomic)
    assert again["round_trips"] == 3
    assert again["simple"][1].startswith("ROLLBACK;PREPARE hopper_")
    assert count(in_atomic)["round_trips"] == 2
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM hopper_job WHERE queue = 'dealloc'")
        assert cur.fetchone() == (4,)


def test_enqueue__a_statement_found_taken_then_missing_is_prepared_again(
    tx_engine: BaseEngine,
) -> None:
    # Through a transaction pooler not declared in POOLERS, the PREPARE may
    # find the name taken on one server connection (another client prepared
    # it) and the EXECUTE that follows land on one where it is missing.
    p = JobInsertParams(kind="tests.job", queue="taken")

    def in_atomic() -> JobRow:
        with transaction.atomic():
            return tx_engine.job_insert_many([p])[0].job

    in_atomic()  # prepared on the session, and known to hopper
    connection._hopper_named[1].clear()  # hopper no longer knows it (a new client)
    raw = connection.connection
    real = raw.pgconn

    class OtherServer:
        """The pgconn, except that a BEGIN;EXECUTE runs where the statement is missing."""

        def __getattr__(self, attr: str) -> Any:
            return getattr(real, attr)

        def exec_(self, query: bytes) -> Any:
            raw.pgconn = real  # psycopg's own statements (the rollback) use the real one
            if query.startswith(b"BEGIN;EXECUTE "):
                name = query[len(b"BEGIN;EXECUTE ") :].split(b"(", 1)[0]
                real.exec_(b"DEALLOCATE " + name)
            return real.exec_(query)

    other = OtherServer()
    _raw, prepared, tx, quoted = connection._hopper_named

    class Quoting:
        """The connection's literals, quoted on the real pgconn."""

        def __getattr__(self, attr: str) -> Any:
            return getattr(tx, attr)

        def as_literal(self, obj: Any) -> bytes:
            raw.pgconn = real
            try:
                return tx.as_literal(obj)  # type: ignore[no-any-return]
            finally:
                raw.pgconn = other  # type: ignore[assignment]

    connection._hopper_named = (raw, prepared, Quoting(), {})
    raw.pgconn = other  # type: ignore[assignment]
    try:
        job = in_atomic()
    finally:
        raw.pgconn = real
        connection._hopper_named = (raw, prepared, tx, quoted)
    assert tx_engine.job_get(job.id) is not None
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE


def test_enqueue__a_connection_with_its_own_isolation_level_keeps_psycopgs_begin(
    tx_engine: BaseEngine,
) -> None:
    p = JobInsertParams(kind="tests.job", queue="iso")
    tx_engine.job_insert_many([p])  # prepares the statement
    connection.connection.isolation_level = IsolationLevel.REPEATABLE_READ
    try:

        def in_atomic() -> None:
            with transaction.atomic():
                tx_engine.job_insert_many([p])

        framed = count(in_atomic)
    finally:
        connection.connection.isolation_level = None
    assert framed["round_trips"] == 3
    assert framed["simple"] == ["BEGIN ISOLATION LEVEL REPEATABLE READ", "COMMIT"]


def test_listener__a_lost_connection_raises_database_error(tx_engine: BaseEngine) -> None:
    listener = tx_engine.listener()
    try:
        listener.listen([CHANNEL_INSERT])
        pid = listener._conn.info.backend_pid  # type: ignore[attr-defined]
        with other_connection() as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
            other.commit()
        with pytest.raises(DatabaseError):
            for _ in range(20):
                listener.next(0.1)
    finally:
        listener.close()


def test_errors__a_terminated_connection_is_database_unavailable(tx_engine: BaseEngine) -> None:
    """A killed backend is a retryable condition, not a bad query: callers may retry."""
    tx_engine.now()
    pid = connection.connection.info.backend_pid
    with other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        other.commit()
    with pytest.raises(DatabaseUnavailable, match="terminating connection"):
        tx_engine.now()
    connection.close()
    assert tx_engine.now() is not None  # a new connection works


def test_errors__a_bad_query_is_not_database_unavailable(tx_engine: BaseEngine) -> None:
    with pytest.raises(DatabaseError) as caught:
        tx_engine._fetchone("x", (), sql="SELECT * FROM no_such_table")  # type: ignore[attr-defined]
    assert not isinstance(caught.value, DatabaseUnavailable)


def test_leader__resign_notifies_only_when_held(engine: BaseEngine, db_now: dt.datetime) -> None:
    a, b = register(engine, db_now), register(engine, db_now)
    from django_hopper.engine.params import LeaderParams

    assert engine.leader_attempt(LeaderParams(client_id=a, ttl=MINUTE, now=db_now))
    assert not engine.leader_attempt(LeaderParams(client_id=b, ttl=MINUTE, now=db_now))
    engine.leader_resign(b)
    assert engine.leader_get(db_now) == a
    engine.leader_resign(a)
    assert engine.leader_get(db_now) is None


def test_enqueue__texts_quoted_once_per_connection_read_back_and_stay_bounded(
    tx_engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The texts an insert carrying its BEGIN sends are quoted once per
    connection (a job's kind and queue repeat on every enqueue), a few and short
    ones only, and a text kept quoted reads back as itself."""
    monkeypatch.setattr(support, "_QUOTED_MAX", 4)
    texts = ["it's", "\\n'\\", 'a "q"', "x" * 300, "ü", "plain"]
    ids = []
    for _ in range(2):
        for text in texts:
            p = JobInsertParams(
                kind="tests.job", queue="quoted", args={"args": [text], "kwargs": {}}
            )
            with transaction.atomic():
                ids.append(
                    (tx_engine.job_insert_many([p], JobInsertOpts(notify=True))[0].job.id, text)
                )
    quoted = connection._hopper_named[3]
    assert 1 <= len(quoted) <= 4
    assert all(len(text) <= support._QUOTED_LENGTH_MAX for text in quoted)
    for job_id, text in ids:
        read = tx_engine.job_get(job_id)
        assert read is not None and read.args == {"args": [text], "kwargs": {}}


def test_enqueue__a_kind_first_seen_after_many_distinct_args_is_still_kept_quoted(
    tx_engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Distinct args of one-off jobs fill the connection's quoted texts; a kind
    and queue that come later are kept quoted all the same."""
    monkeypatch.setattr(support, "_QUOTED_MAX", 16)

    def insert(kind: str, arg: int) -> None:
        p = JobInsertParams(kind=kind, queue="later", args={"args": [arg], "kwargs": {}})
        with transaction.atomic():
            tx_engine.job_insert_many([p], JobInsertOpts(notify=True))

    for arg in range(40):
        insert("tests.first", arg)
    insert("tests.later", 0)
    quoted = connection._hopper_named[3]
    assert "tests.later" in quoted and "later" in quoted
    assert len(quoted) <= 16
