"""job_get, job_logs and job_list (every filter, cursor pagination both ways)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db.migrations.recorder import MigrationRecorder

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobClaimParams, JobInsertParams, JobListParams
from django_hopper.exceptions import InvalidJob
from django_hopper.ids import new_id, new_ids
from django_hopper.types import LIVE_STATES, AttemptLog
from tests.engine_conformance.support import (
    HOUR,
    finalize,
    get,
    insert,
    insert_many,
    list_ids,
    result,
    running,
)
from tests.factories import HistoryFactory, JobFactory, JobLogFactory

# -- now and schema_version ---------------------------------------------------------


def test_now__is_an_aware_utc_time_near_the_machine_clock(engine: BaseEngine) -> None:
    now = engine.now()

    assert now.utcoffset() == dt.timedelta(0)
    assert abs(now - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=5)


def test_schema_version__is_the_newest_applied_hopper_migration(engine: BaseEngine) -> None:
    applied = MigrationRecorder(engine.connection).applied_migrations()
    newest = max(int(name[:4]) for app, name in applied if app == "django_hopper")

    assert engine.schema_version() == newest


# -- job_get -----------------------------------------------------------------------


def test_get__returns_a_live_job(engine: BaseEngine, db_now: dt.datetime) -> None:
    job = insert(engine, db_now, kind="tests.g", args={"a": 1})

    found = engine.job_get(job.id)

    assert found is not None
    assert found.id == job.id
    assert found.args == {"a": 1}
    assert found.is_live


def test_get__returns_a_job_from_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "completed", output=[1, 2]))

    found = engine.job_get(job.id)

    assert found is not None
    assert found.state == "completed"
    assert found.output == [1, 2]
    assert found.finalized_at == db_now


def test_get__returns_none_for_an_unknown_id(engine: BaseEngine) -> None:
    assert engine.job_get(new_id()) is None


def test_get__reports_the_lease_expiry_of_a_job_claimed_by_id(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = JobFactory(now=db_now, leased=True)

    found = get(engine, job.id)

    assert found.state == "running"
    assert found.attempted_by is None
    assert found.lease_expires_at == job.lease_expires_at


def test_get__reads_no_dependencies(engine: BaseEngine, db_now: dt.datetime) -> None:
    job = insert(engine, db_now)

    assert get(engine, job).dependencies is None


# -- job_logs ----------------------------------------------------------------------


def test_logs__returns_the_job_logs_oldest_first(engine: BaseEngine, db_now: dt.datetime) -> None:
    job = insert(engine, db_now)
    JobLogFactory(now=db_now, job_id=job.id, attempt=1, log="one\n")
    JobLogFactory(now=db_now, job_id=job.id, attempt=1, log="snoozed\n", snoozed=True)
    JobLogFactory(now=db_now, job_id=job.id, attempt=2, log="two\n")
    JobLogFactory(now=db_now, job_id=new_id(), attempt=1, log="another job\n")

    assert engine.job_logs(job.id) == [
        AttemptLog(attempt=1, log="one\n"),
        AttemptLog(attempt=1, log="snoozed\n", snoozed=True),
        AttemptLog(attempt=2, log="two\n"),
    ]


def test_logs__of_an_unknown_job_are_empty(engine: BaseEngine) -> None:
    assert engine.job_logs(new_id()) == []


# -- job_list: order and pagination ----------------------------------------------------


@pytest.fixture
def mixed(engine: BaseEngine, db_now: dt.datetime, client_id: int) -> list[Any]:
    """Six jobs of kind ``tests.m`` in ID order, live and in history alike.

    ids[1] is completed and ids[4] discarded (history), ids[2] is running, and
    ids[0], ids[3], ids[5] are available.
    """
    ids = sorted(new_ids(6))
    priority = {ids[1]: 10, ids[4]: 9, ids[2]: 8}
    insert_many(
        engine,
        [
            JobInsertParams(kind="tests.m", id=i, queue="mq", priority=priority.get(i, 0))
            for i in ids
        ],
        db_now,
    )
    claimed = engine.job_claim(
        JobClaimParams(queue="mq", client_id=client_id, limit=3, now=db_now)
    ).jobs
    assert [j.id for j in claimed] == [ids[1], ids[4], ids[2]]
    finalize(engine, db_now, result(claimed[0], "completed"), result(claimed[1], "discarded"))
    return ids


def test_list__returns_live_and_history_jobs_in_id_order(
    engine: BaseEngine, mixed: list[Any]
) -> None:
    assert list_ids(engine, kinds=("tests.m",)) == mixed


def test_list__newest_first_returns_descending_id_order(
    engine: BaseEngine, mixed: list[Any]
) -> None:
    assert list_ids(engine, kinds=("tests.m",), newest_first=True) == mixed[::-1]


def test_list__limit_caps_the_rows(engine: BaseEngine, mixed: list[Any]) -> None:
    assert list_ids(engine, kinds=("tests.m",), limit=4) == mixed[:4]
    assert list_ids(engine, kinds=("tests.m",), limit=4, newest_first=True) == mixed[:1:-1]


def _pages(engine: BaseEngine, size: int, **filters: Any) -> list[list[Any]]:
    pages: list[list[Any]] = []
    after = None
    while True:
        page = list_ids(engine, limit=size, after=after, **filters)
        if not page:
            return pages
        pages.append(page)
        after = page[-1]
        assert len(pages) < 20, "pagination does not end"


def test_list__cursor_pages_forward_without_gaps_or_repeats(
    engine: BaseEngine, mixed: list[Any]
) -> None:
    pages = _pages(engine, 4, kinds=("tests.m",))

    assert pages == [mixed[:4], mixed[4:]]


def test_list__cursor_pages_backward_with_newest_first(
    engine: BaseEngine, mixed: list[Any]
) -> None:
    pages = _pages(engine, 4, kinds=("tests.m",), newest_first=True)

    assert pages == [mixed[:1:-1], mixed[1::-1]]


def test_list__the_cursor_is_exclusive(engine: BaseEngine, mixed: list[Any]) -> None:
    assert list_ids(engine, kinds=("tests.m",), after=mixed[2]) == mixed[3:]
    assert list_ids(engine, kinds=("tests.m",), after=mixed[2], newest_first=True) == [
        mixed[1],
        mixed[0],
    ]


def test_list__a_cursor_that_names_no_job_still_orders_by_id(
    engine: BaseEngine, mixed: list[Any]
) -> None:
    before_all = mixed[0].__class__(int=mixed[0].int - 1)

    assert list_ids(engine, kinds=("tests.m",), after=before_all) == mixed


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (("available",), [0, 3, 5]),
        (("running",), [2]),
        (("completed",), [1]),
        (("completed", "discarded"), [1, 4]),
        (("running", "discarded"), [2, 4]),
        (LIVE_STATES, [0, 2, 3, 5]),
        (("canceled",), []),
    ],
)
def test_list__states_filter_reads_live_and_history_as_needed(
    engine: BaseEngine, mixed: list[Any], states: tuple[str, ...], expected: list[int]
) -> None:
    assert list_ids(engine, kinds=("tests.m",), states=states) == [mixed[i] for i in expected]


def test_list__ids_filter_matches_live_and_history_jobs(
    engine: BaseEngine, mixed: list[Any]
) -> None:
    wanted = (mixed[4], mixed[0], new_id())

    assert list_ids(engine, ids=wanted) == [mixed[0], mixed[4]]


# -- job_list: filters ---------------------------------------------------------------


def test_list__queue_filter(engine: BaseEngine, db_now: dt.datetime) -> None:
    a = insert(engine, db_now, queue="qa")
    insert(engine, db_now, queue="qb")
    a2 = insert(engine, db_now, queue="qa")

    assert list_ids(engine, queue="qa") == [a.id, a2.id]


def test_list__kinds_filter_matches_any_of_the_kinds(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    one = insert(engine, db_now, kind="tests.one")
    insert(engine, db_now, kind="tests.two")
    three = insert(engine, db_now, kind="tests.three")

    assert list_ids(engine, kinds=("tests.three", "tests.one")) == [one.id, three.id]


def test_list__ordering_key_filter_within_a_queue(engine: BaseEngine, db_now: dt.datetime) -> None:
    lane = insert(engine, db_now, queue="qa", ordering_key="lane")
    insert(engine, db_now, queue="qb", ordering_key="lane")
    insert(engine, db_now, queue="qa", ordering_key="other")
    insert(engine, db_now, queue="qa")

    assert list_ids(engine, queue="qa", ordering_key="lane") == [lane.id]


def test_list__ordering_key_without_a_queue_is_invalid(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob) as info:
        engine.job_list(JobListParams(ordering_key="lane"))

    assert info.value.field == "ordering_key"


def test_list__a_negative_limit_is_invalid(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob) as info:
        engine.job_list(JobListParams(limit=-1))

    assert info.value.field == "limit"


def test_list__priorities_filter_matches_any_of_the_priorities(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    low = insert(engine, db_now, kind="tests.p", priority=-3)
    insert(engine, db_now, kind="tests.p", priority=0)
    high = insert(engine, db_now, kind="tests.p", priority=1)

    assert list_ids(engine, kinds=("tests.p",), priorities=(1, -3)) == [low.id, high.id]


@pytest.fixture
def tagged(engine: BaseEngine, db_now: dt.datetime) -> dict[str, Any]:
    jobs = {
        "red": ("red",),
        "red_blue": ("red", "blue"),
        "blue_green": ("blue", "green"),
        "none": (),
    }
    return {
        name: insert(engine, db_now, kind="tests.t", tags=tags).id for name, tags in jobs.items()
    }


@pytest.mark.parametrize(
    ("tags_any", "tags_all", "expected"),
    [
        (("red", "green"), (), ["red", "red_blue", "blue_green"]),
        (("blue",), (), ["red_blue", "blue_green"]),
        (("purple",), (), []),
        ((), ("red", "blue"), ["red_blue"]),
        ((), ("blue",), ["red_blue", "blue_green"]),
        ((), ("red", "green"), []),
        (("green", "red"), ("blue",), ["red_blue", "blue_green"]),
        (("green",), ("blue",), ["blue_green"]),
    ],
)
def test_list__tags_any_and_tags_all_filters(
    engine: BaseEngine,
    tagged: dict[str, Any],
    tags_any: tuple[str, ...],
    tags_all: tuple[str, ...],
    expected: list[str],
) -> None:
    found = list_ids(engine, kinds=("tests.t",), tags_any=tags_any, tags_all=tags_all)

    assert found == [tagged[name] for name in expected]


def test_list__empty_tag_filters_match_untagged_jobs_too(
    engine: BaseEngine, tagged: dict[str, Any]
) -> None:
    found = list_ids(engine, kinds=("tests.t",), tags_any=(), tags_all=())

    assert found == [tagged[name] for name in ("red", "red_blue", "blue_green", "none")]


def test_list__tag_filters_read_history_too(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    jobs = {
        name: running(engine, client_id, db_now, kind="tests.th", tags=tags)
        for name, tags in (("red", ("red",)), ("red_blue", ("red", "blue")), ("none", ()))
    }
    finalize(engine, db_now, *(result(job, "completed") for job in jobs.values()))
    live = insert(engine, db_now, kind="tests.th", tags=("blue",))
    ids = {name: job.id for name, job in jobs.items()}

    assert list_ids(engine, kinds=("tests.th",), tags_any=("red",)) == [ids["red"], ids["red_blue"]]
    assert list_ids(engine, kinds=("tests.th",), tags_all=("red", "blue")) == [ids["red_blue"]]
    assert list_ids(engine, kinds=("tests.th",), tags_any=("blue",)) == [ids["red_blue"], live.id]
    assert list_ids(engine, kinds=("tests.th",), tags_any=(), tags_all=()) == [
        ids["red"],
        ids["red_blue"],
        ids["none"],
        live.id,
    ]


METADATA = {
    "gold": {"tenant": "acme", "plan": {"tier": "gold", "seats": 5}, "regions": ["eu", "us"]},
    "free": {"tenant": "acme", "plan": {"tier": "free"}, "regions": ["eu"]},
    "number": {"tenant": "other", "n": 1},
    "string": {"n": "1"},
    "items": {"items": [{"sku": "a", "qty": 1}, {"sku": "b"}]},
    "null": {"nul": None},
    "flag": {"flag": True},
    "empty": {},
}


@pytest.fixture
def with_metadata(engine: BaseEngine, db_now: dt.datetime) -> dict[str, Any]:
    return {
        name: insert(engine, db_now, kind="tests.md", metadata=meta).id
        for name, meta in METADATA.items()
    }


@pytest.mark.parametrize(
    ("contains", "expected"),
    [
        ({"tenant": "acme"}, ["gold", "free"]),
        ({"tenant": "acme", "regions": ["us"]}, ["gold"]),
        ({"plan": {"tier": "gold"}}, ["gold"]),
        ({"plan": {"tier": "gold", "seats": 6}}, []),
        ({"plan": {}}, ["gold", "free"]),
        ({"regions": ["eu"]}, ["gold", "free"]),
        ({"regions": ["us", "eu"]}, ["gold"]),
        ({"regions": []}, ["gold", "free"]),
        ({"n": 1}, ["number"]),
        ({"n": "1"}, ["string"]),
        ({"n": True}, []),
        ({"flag": True}, ["flag"]),
        ({"flag": 1}, []),
        ({"items": [{"sku": "b"}]}, ["items"]),
        ({"items": [{"sku": "a", "qty": 1}]}, ["items"]),
        ({"items": [{"sku": "a", "qty": 2}]}, []),
        ({"nul": None}, ["null"]),
        ({"missing": None}, []),
        ({}, list(METADATA)),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_list__metadata_filter_matches_containment(
    engine: BaseEngine,
    with_metadata: dict[str, Any],
    contains: dict[str, Any],
    expected: list[str],
) -> None:
    found = list_ids(engine, kinds=("tests.md",), metadata=contains)

    assert found == [with_metadata[name] for name in expected]


def test_list__metadata_filter_reads_history_too(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now, kind="tests.mh", metadata={"tenant": "acme"})
    finalize(engine, db_now, result(job, "completed"))
    HistoryFactory(now=db_now - HOUR, kind="tests.mh", metadata={"tenant": "other"})

    assert list_ids(engine, kinds=("tests.mh",), metadata={"tenant": "acme"}) == [job.id]


def test_list__filters_combine_with_and(engine: BaseEngine, db_now: dt.datetime) -> None:
    match = insert(
        engine, db_now, kind="tests.c", queue="qa", priority=2, tags=("x",), metadata={"k": 1}
    )
    insert(engine, db_now, kind="tests.c", queue="qb", priority=2, tags=("x",), metadata={"k": 1})
    insert(engine, db_now, kind="tests.c", queue="qa", priority=3, tags=("x",), metadata={"k": 1})
    insert(engine, db_now, kind="tests.c", queue="qa", priority=2, tags=("y",), metadata={"k": 1})
    insert(engine, db_now, kind="tests.c", queue="qa", priority=2, tags=("x",), metadata={"k": 2})
    insert(engine, db_now, kind="tests.d", queue="qa", priority=2, tags=("x",), metadata={"k": 1})
    insert(
        engine,
        db_now + HOUR,
        kind="tests.c",
        queue="qa",
        priority=2,
        tags=("x",),
        metadata={"k": 1},
        scheduled_at=db_now + 2 * HOUR,
    )

    found = list_ids(
        engine,
        queue="qa",
        kinds=("tests.c",),
        states=("available",),
        priorities=(2,),
        tags_any=("x",),
        metadata={"k": 1},
    )

    assert found == [match.id]
