"""job_insert_many / job_insert_copy: states, fields, unique keys, REPLACE."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobCancelParams,
    JobInsertOpts,
    JobInsertParams,
    JobInsertResult,
    WorkflowInsertParams,
)
from django_hopper.exceptions import NotSupported
from django_hopper.ids import new_id
from django_hopper.types import ConflictAction, JobRow
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim_one,
    finalize,
    get,
    insert,
    insert_many,
    list_ids,
    live_ids,
    result,
    running,
)
from tests.factories import HistoryFactory, JobFactory

# -- plain inserts -----------------------------------------------------------


def test_insert__returns_one_available_job_per_input_in_input_order(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    results = insert_many(engine, [JobInsertParams(kind=f"tests.k{n}") for n in (3, 1, 2)], db_now)

    assert [r.job.kind for r in results] == ["tests.k3", "tests.k1", "tests.k2"]
    for r in results:
        assert r.duplicate is False
        assert r.job.state == "available"
        assert r.job.attempt == 0
        assert r.job.fence == 0
        assert r.job.created_at == db_now
        assert r.job.scheduled_at == db_now
        assert r.job.attempted_at is None
        assert r.job.attempted_by is None
        assert r.job.finalized_at is None
        assert r.job.errors == []
    assert len({r.job.id for r in results}) == 3


#: A job with one field off its default (the key), for the one-job insert.
_ONE_FIELD = {
    "none": lambda now: {},
    "scheduled_at": lambda now: {"scheduled_at": now + HOUR},
    "past scheduled_at": lambda now: {"scheduled_at": now - HOUR},
    "ttl": lambda now: {"ttl": 2 * HOUR},
    "metadata": lambda now: {"metadata": {"m": [1, "x"]}},
    "tags": lambda now: {"tags": ("a", "b")},
    "ordering_key": lambda now: {"ordering_key": "o"},
    "partition_key": lambda now: {"partition_key": "p"},
    "subject": lambda now: {"subject": "user:1"},
    "awaited": lambda now: {"awaited": True},
}


@pytest.mark.parametrize("field", list(_ONE_FIELD))
def test_insert__one_job_stores_what_a_batch_stores(
    engine: BaseEngine, db_now: dt.datetime, field: str
) -> None:
    """A single job (every ``enqueue()``, which engines insert by a statement of
    its own) is stored and returned as the same job in a batch is, on the
    database's clock as enqueue() inserts it, whichever field is set."""
    p = JobInsertParams(
        kind="tests.one",
        queue="q1",
        priority=3,
        max_attempts=4,
        args={"args": [1, None], "kwargs": {"b": "x", "a": 2.5}},
        **_ONE_FIELD[field](db_now),
    )
    opts = JobInsertOpts(notify=True)

    one = engine.job_insert_many([p], opts)[0]
    in_batch = engine.job_insert_many([p, JobInsertParams(kind="tests.other")], opts)[0]

    assert one.duplicate is in_batch.duplicate is False
    assert one.job == get(engine, one.job)
    assert in_batch.job == get(engine, in_batch.job)
    assert one.job.state == in_batch.job.state
    if p.scheduled_at is None:
        assert one.job.scheduled_at == one.job.created_at

    def relative(job: JobRow) -> JobRow:
        """The job with its ID and times of insertion left out, its expiry relative."""
        return dataclasses.replace(
            job,
            id=in_batch.job.id,
            created_at=db_now,
            scheduled_at=db_now if p.scheduled_at is None else job.scheduled_at,
            expires_at=None if job.expires_at is None else job.expires_at - job.created_at,
        )

    assert relative(one.job) == relative(in_batch.job)


def test_insert__one_job_runs_through_djangos_cursor_while_it_is_observed(
    engine: BaseEngine,
) -> None:
    """Observed (``CaptureQueriesContext``, ``DEBUG``), the one-job insert of
    ``enqueue()`` is sent through Django's cursor, which sees it, and stores the same."""
    p = JobInsertParams(kind="tests.one", args={"args": [1], "kwargs": {}})
    with CaptureQueriesContext(connections[engine.alias]) as ctx:
        one = engine.job_insert_many([p], JobInsertOpts(notify=True))[0]

    assert [q for q in ctx.captured_queries if "insert into hopper_job" in q["sql"].lower()]
    assert one.job == get(engine, one.job)
    assert one.job.scheduled_at == one.job.created_at


def test_insert__one_job_reads_as_stored_even_after_its_params_change(
    engine: BaseEngine,
) -> None:
    """The row of a one-job insert may be built when first read: it is the
    row as stored, whatever the caller did to its params since."""
    p = JobInsertParams(kind="tests.one", queue="q1", args={"args": [1], "kwargs": {}})
    one = engine.job_insert_many([p], JobInsertOpts(notify=True))[0]
    p.kind, p.queue, p.priority, p.max_attempts = "tests.other", "q2", 9, 2
    p.args = {"args": [2], "kwargs": {}}

    assert one.job == get(engine, one.job)
    assert (one.job.kind, one.job.queue, one.job.args) == (
        "tests.one",
        "q1",
        {"args": [1], "kwargs": {}},
    )
    assert one == JobInsertResult(one.job)


class _Dict(dict):  # type: ignore[type-arg]
    """A dict subclass: JSON-encodable, read back as a plain dict."""


#: JSON-encodable values that read back as something else: an int key (a
#: string key once stored), tuples (lists) and a dict subclass (a dict).
_NOT_NORMAL_ARGS = {1: "a", "t": (1, (2, 3)), "d": _Dict(x=(4,)), "l": [{2: None}]}
_NOT_NORMAL_METADATA = {3: ["m"], "s": _Dict(k=("v",))}
_AS_STORED_ARGS = {"1": "a", "t": [1, [2, 3]], "d": {"x": [4]}, "l": [{"2": None}]}
_AS_STORED_METADATA = {"3": ["m"], "s": {"k": ["v"]}}

#: Each way an engine inserts jobs and builds their rows: the one-job insert
#: (its row built when first read), the one-job insert with metadata, a batch,
#: a batch with a unique key, COPY, a workflow.
_INSERT_PATHS = ("one job", "one job with metadata", "batch", "unique", "copy", "workflow")


@pytest.mark.parametrize("path", _INSERT_PATHS)
def test_insert__returns_the_args_and_metadata_as_stored(
    engine: BaseEngine, db_now: dt.datetime, path: str
) -> None:
    """Arguments and metadata that JSON encodes but reads back otherwise (int
    keys, tuples, a dict subclass) come back from the insert as ``job_get``
    reads them, not as the caller's objects: the same row on every engine."""
    metadata = {} if path == "one job" else _NOT_NORMAL_METADATA
    p = JobInsertParams(kind="tests.normal", args=_NOT_NORMAL_ARGS, metadata=metadata)
    opts = JobInsertOpts(notify=True)
    if path in ("one job", "one job with metadata"):
        (res,) = engine.job_insert_many([p], opts)
    elif path == "batch":
        res, _ = engine.job_insert_many([p, JobInsertParams(kind="tests.other")], opts)
    elif path == "unique":
        res, _ = engine.job_insert_many(
            [dataclasses.replace(p, unique_key="u"), JobInsertParams(kind="tests.other")], opts
        )
    elif path == "copy":
        if not engine.features.supports_copy:
            pytest.skip("the engine has no COPY")
        res, _ = engine.job_insert_copy([p, JobInsertParams(kind="tests.other")], opts)
    else:
        wf = engine.workflow_insert(
            WorkflowInsertParams(name="normal", jobs=[p, JobInsertParams(kind="tests.other")])
        )
        res = wf.jobs[0]

    stored = get(engine, res.job)
    assert (stored.args, stored.metadata) == (
        _AS_STORED_ARGS,
        _AS_STORED_METADATA if metadata else {},
    )
    assert (res.job.args, res.job.metadata) == (stored.args, stored.metadata)
    assert res.job == stored


def test_insert__an_empty_batch_inserts_nothing(engine: BaseEngine, db_now: dt.datetime) -> None:
    assert insert_many(engine, [], db_now) == []
    assert list_ids(engine) == []


def test_insert__stores_every_field_as_given(engine: BaseEngine, db_now: dt.datetime) -> None:
    # batch_id is stored as given too (test_batches), but a batch job cannot
    # have a unique key, so it is left out here.
    job_id = new_id()
    params = JobInsertParams(
        kind="tests.full",
        queue="mail",
        priority=7,
        max_attempts=3,
        args={"args": [1, "two"], "kwargs": {"x": {"y": [None, True]}}},
        metadata={"tenant": "acme", "n": 1.5},
        tags=("b", "a"),
        unique_key="key-1",
        ordering_key="lane-1",
        partition_key="part-1",
        awaited=True,
        id=job_id,
    )
    (inserted,) = insert_many(engine, [params], db_now)

    for job in (inserted.job, get(engine, job_id)):
        assert job.id == job_id
        assert job.kind == "tests.full"
        assert job.queue == "mail"
        assert job.priority == 7
        assert job.max_attempts == 3
        assert job.args == {"args": [1, "two"], "kwargs": {"x": {"y": [None, True]}}}
        assert job.metadata == {"tenant": "acme", "n": 1.5}
        assert job.tags == ["b", "a"]
        assert job.unique_key == "key-1"
        assert job.ordering_key == "lane-1"
        assert job.partition_key == "part-1"
        assert job.batch_id is None
        assert job.awaited is True
        assert job.expires_at is None
        assert job.snooze_reason is None
        assert job.progress is None


def test_insert__optional_fields_default_to_none_and_empty(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = get(engine, insert(engine, db_now))

    assert job.queue == "default"
    assert job.priority == 0
    assert job.max_attempts == 25
    assert job.args == {}
    assert job.metadata == {}
    assert job.tags == []
    assert job.unique_key is None
    assert job.ordering_key is None
    assert job.partition_key is None
    assert job.batch_id is None
    assert job.awaited is False


def test_insert__generates_distinct_time_ordered_ids(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    first = insert(engine, db_now)
    second = insert(engine, db_now)

    assert first.id.version == 7
    assert second.id.version == 7
    assert first.id < second.id


def test_insert__future_scheduled_at_makes_the_job_scheduled(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, scheduled_at=db_now + HOUR)

    assert job.state == "scheduled"
    assert job.scheduled_at == db_now + HOUR


def test_insert__past_scheduled_at_makes_the_job_available_and_keeps_the_time(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, scheduled_at=db_now - HOUR)

    assert job.state == "available"
    assert job.scheduled_at == db_now - HOUR


def test_insert__ttl_sets_expires_at_from_database_now(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, ttl=10 * MINUTE)

    assert job.expires_at == db_now + 10 * MINUTE
    assert get(engine, job).expires_at == db_now + 10 * MINUTE


# -- unique keys ---------------------------------------------------------------


def test_insert__duplicate_of_a_live_job_returns_the_existing_job(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    first = insert(engine, db_now, kind="tests.u", unique_key="k", args={"v": 1})

    (again,) = insert_many(
        engine,
        [JobInsertParams(kind="tests.u", unique_key="k", args={"v": 2}, priority=9)],
        db_now + SECOND,
    )

    assert again.duplicate is True
    assert again.job.id == first.id
    assert again.job.args == {"v": 1}
    assert again.job.priority == 0
    assert live_ids(engine, kinds=("tests.u",)) == [first.id]


def test_insert__duplicate_of_a_running_job_returns_it_running(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, kind="tests.u", unique_key="k")

    (again,) = insert_many(engine, [JobInsertParams(kind="tests.u", unique_key="k")], db_now)

    assert again.duplicate is True
    assert again.job.id == job.id
    assert again.job.state == "running"


def test_insert__same_unique_key_of_another_kind_is_not_a_duplicate(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    first = insert(engine, db_now, kind="tests.a", unique_key="k")

    (other,) = insert_many(engine, [JobInsertParams(kind="tests.b", unique_key="k")], db_now)

    assert other.duplicate is False
    assert other.job.id != first.id


def test_insert__batch_reports_duplicates_and_new_jobs_in_input_order(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    existing = insert(engine, db_now, kind="tests.u", unique_key="old")

    results = insert_many(
        engine,
        [
            JobInsertParams(kind="tests.u", unique_key="new-1"),
            JobInsertParams(kind="tests.u", unique_key="old"),
            JobInsertParams(kind="tests.plain"),
        ],
        db_now,
    )

    assert [r.duplicate for r in results] == [False, True, False]
    assert results[0].job.unique_key == "new-1"
    assert results[1].job.id == existing.id
    assert results[2].job.kind == "tests.plain"


def test_insert__a_finished_job_is_not_a_duplicate_without_unique_finished(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, kind="tests.u", unique_key="k")
    finalize(engine, db_now, result(job, "completed"))

    (again,) = insert_many(engine, [JobInsertParams(kind="tests.u", unique_key="k")], db_now)

    assert again.duplicate is False
    assert again.job.id != job.id
    assert again.job.state == "available"


def test_insert__unique_finished_returns_the_job_in_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, kind="tests.u", unique_key="k")
    finalize(engine, db_now, result(job, "completed", output={"r": 1}))

    (again,) = insert_many(
        engine,
        [JobInsertParams(kind="tests.u", unique_key="k", unique_finished=("completed",))],
        db_now + SECOND,
    )

    assert again.duplicate is True
    assert again.job.id == job.id
    assert again.job.state == "completed"
    assert again.job.output == {"r": 1}
    assert live_ids(engine, kinds=("tests.u",)) == []


def test_insert__unique_finished_ignores_history_in_other_states(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now, kind="tests.u", unique_key="k")
    engine.job_cancel(JobCancelParams(id=job.id, now=db_now))

    (again,) = insert_many(
        engine,
        [JobInsertParams(kind="tests.u", unique_key="k", unique_finished=("completed",))],
        db_now,
    )

    assert again.duplicate is False
    assert again.job.id != job.id


def test_insert__unique_finished_matches_only_the_same_kind(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    HistoryFactory(now=db_now, kind="tests.other", unique_key="k", completed=True)

    (again,) = insert_many(
        engine,
        [JobInsertParams(kind="tests.u", unique_key="k", unique_finished=("completed",))],
        db_now,
    )

    assert again.duplicate is False


def test_insert__unique_finished_returns_the_newest_job_in_history(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    older_id, newer_id = sorted([new_id(), new_id()])
    HistoryFactory(now=db_now - HOUR, id=older_id, kind="tests.u", unique_key="k", discarded=True)
    HistoryFactory(now=db_now - MINUTE, id=newer_id, kind="tests.u", unique_key="k", canceled=True)

    (again,) = insert_many(
        engine,
        [
            JobInsertParams(
                kind="tests.u", unique_key="k", unique_finished=("canceled", "discarded")
            )
        ],
        db_now,
    )

    assert again.duplicate is True
    assert again.job.id == newer_id
    assert again.job.state == "canceled"


def test_insert__a_live_duplicate_wins_over_history_with_unique_finished(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    HistoryFactory(now=db_now - HOUR, kind="tests.u", unique_key="k", completed=True)
    live = insert(engine, db_now, kind="tests.u", unique_key="k")

    (again,) = insert_many(
        engine,
        [JobInsertParams(kind="tests.u", unique_key="k", unique_finished=("completed",))],
        db_now,
    )

    assert again.duplicate is True
    assert again.job.id == live.id


# -- ConflictAction.REPLACE ----------------------------------------------------


def _replace(engine: BaseEngine, now: dt.datetime, params: JobInsertParams) -> JobInsertResult:
    (res,) = engine.job_insert_many(
        [params], JobInsertOpts(now=now, on_conflict=ConflictAction.REPLACE)
    )
    return res


def test_insert__replace_rewrites_a_waiting_duplicate(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    first = insert(
        engine,
        db_now,
        kind="tests.u",
        unique_key="k",
        args={"v": 1},
        metadata={"m": 1},
        priority=1,
        max_attempts=5,
        scheduled_at=db_now + HOUR,
        tags=("keep",),
    )
    assert first.state == "scheduled"

    res = _replace(
        engine,
        db_now + SECOND,
        JobInsertParams(
            kind="tests.u",
            unique_key="k",
            args={"v": 2},
            metadata={"m": 2},
            priority=9,
            max_attempts=7,
            scheduled_at=db_now - MINUTE,
        ),
    )

    assert res.duplicate is True
    for job in (res.job, get(engine, first)):
        assert job.id == first.id
        assert job.args == {"v": 2}
        assert job.metadata == {"m": 2}
        assert job.priority == 9
        assert job.max_attempts == 7
        assert job.scheduled_at == db_now - MINUTE
        assert job.state == "available"
    assert live_ids(engine, kinds=("tests.u",)) == [first.id]


def test_insert__replace_with_a_future_time_makes_an_available_job_scheduled(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    first = insert(engine, db_now, kind="tests.u", unique_key="k")

    res = _replace(
        engine,
        db_now,
        JobInsertParams(kind="tests.u", unique_key="k", scheduled_at=db_now + HOUR),
    )

    assert res.job.id == first.id
    assert res.job.state == "scheduled"
    assert get(engine, first).scheduled_at == db_now + HOUR


def test_insert__replace_clears_the_snooze_reason(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, kind="tests.u", unique_key="k")
    finalize(
        engine,
        db_now,
        result(job, "scheduled", delay=HOUR, snooze=True, snooze_reason="waiting for x"),
    )
    assert get(engine, job).snooze_reason == "waiting for x"

    res = _replace(engine, db_now, JobInsertParams(kind="tests.u", unique_key="k"))

    assert res.duplicate is True
    assert res.job.state == "available"
    assert res.job.snooze_reason is None
    assert get(engine, job).snooze_reason is None


def test_insert__replace_leaves_a_running_job_unchanged(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, kind="tests.u", unique_key="k", args={"v": 1})

    res = _replace(
        engine,
        db_now,
        JobInsertParams(kind="tests.u", unique_key="k", args={"v": 2}, priority=5),
    )

    assert res.duplicate is True
    for row in (res.job, get(engine, job)):
        assert row.id == job.id
        assert row.state == "running"
        assert row.args == {"v": 1}
        assert row.priority == 0
        assert row.fence == job.fence


def test_insert__replace_keeps_a_pending_job_pending(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    pending = JobFactory(now=db_now, pending=True, kind="tests.u", unique_key="k")

    res = _replace(engine, db_now, JobInsertParams(kind="tests.u", unique_key="k", args={"v": 2}))

    assert res.duplicate is True
    assert res.job.id == pending.id
    assert res.job.state == "pending"
    assert res.job.args == {"v": 2}


def test_insert__skip_leaves_the_duplicate_unchanged(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    first = insert(engine, db_now, kind="tests.u", unique_key="k", scheduled_at=db_now + HOUR)

    (again,) = engine.job_insert_many(
        [JobInsertParams(kind="tests.u", unique_key="k", args={"v": 2})],
        JobInsertOpts(now=db_now, on_conflict=ConflictAction.SKIP),
    )

    assert again.duplicate is True
    stored = get(engine, first)
    assert stored.args == {}
    assert stored.state == "scheduled"
    assert stored.scheduled_at == db_now + HOUR


# -- notify option and COPY ----------------------------------------------------


def test_insert__with_notify_inserts_normally(engine: BaseEngine, db_now: dt.datetime) -> None:
    results = insert_many(
        engine,
        [JobInsertParams(kind="tests.n", queue="a"), JobInsertParams(kind="tests.n", queue="b")],
        db_now,
        notify=True,
    )

    assert [r.job.queue for r in results] == ["a", "b"]
    assert sorted(list_ids(engine, kinds=("tests.n",))) == sorted(r.job.id for r in results)


def test_insert_copy__loads_jobs_or_is_not_supported(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    params = [JobInsertParams(kind="tests.copy", args={"n": n}) for n in range(3)]
    if not engine.features.supports_copy:
        with pytest.raises(NotSupported):
            engine.job_insert_copy(params, JobInsertOpts(now=db_now))
        return

    results = engine.job_insert_copy(params, JobInsertOpts(now=db_now))

    assert [r.job.args for r in results] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(r.duplicate is False and r.job.state == "available" for r in results)
    assert sorted(list_ids(engine, kinds=("tests.copy",))) == sorted(r.job.id for r in results)


def test_insert_copy__future_jobs_are_scheduled(engine: BaseEngine, db_now: dt.datetime) -> None:
    if not engine.features.supports_copy:
        pytest.skip("engine has no COPY")

    (res,) = engine.job_insert_copy(
        [JobInsertParams(kind="tests.copy", scheduled_at=db_now + HOUR, ttl=2 * HOUR)],
        JobInsertOpts(now=db_now),
    )

    job = get(engine, res.job)
    assert job.state == "scheduled"
    assert job.expires_at == db_now + 2 * HOUR


def test_insert__claimed_job_keeps_its_claim_after_a_duplicate_insert(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now, kind="tests.u", unique_key="k", queue="dup")
    job = claim_one(engine, client_id, db_now, queue="dup")

    insert_many(engine, [JobInsertParams(kind="tests.u", unique_key="k", queue="dup")], db_now)

    stored = get(engine, job)
    assert stored.state == "running"
    assert stored.attempted_by == client_id
