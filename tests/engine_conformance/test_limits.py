"""Queue limits: the limited claim path, its global, rate and partition limits."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRenewParams,
    JobClaimParams,
    JobClaimResult,
    JobInsertParams,
)
from django_hopper.exceptions import InvalidJob, UnknownQueue
from django_hopper.models import Queue
from django_hopper.types import QueueLimits
from tests.engine_conformance.support import (
    HOUR,
    SECOND,
    claim,
    finalize,
    insert_many,
    result,
)

Q = "limited"


def controls(engine: BaseEngine) -> BaseEngine:
    return engine


def set_limits(engine: BaseEngine, now: dt.datetime, **limits: object) -> None:
    controls(engine).queue_set_limits(QueueLimits(name=Q, **limits), now=now)  # type: ignore[arg-type]


def fill(engine: BaseEngine, now: dt.datetime, n: int, **fields: object) -> None:
    insert_many(engine, [JobInsertParams(kind="tests.job", queue=Q, **fields)] * n, now)  # type: ignore[arg-type]


def limited(
    engine: BaseEngine, client_id: int, now: dt.datetime, limit: int = 10
) -> JobClaimResult:
    return engine.job_claim(
        JobClaimParams(queue=Q, client_id=client_id, limit=limit, limited=True, now=now)
    )


def test_global_limit__caps_running_jobs_across_clients(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    set_limits(engine, db_now, global_limit=3)
    fill(engine, db_now, 10)

    first = limited(engine, client_id, db_now, limit=2).jobs
    second = limited(engine, other_client_id, db_now, limit=10)

    assert (len(first), len(second.jobs), second.wait) == (2, 1, dt.timedelta(0))
    assert limited(engine, client_id, db_now).jobs == []
    finalize(engine, db_now, result(first[0], "completed"))
    assert len(limited(engine, client_id, db_now).jobs) == 1


def test_rate_limit__allows_a_burst_then_tokens_at_the_rate_and_says_how_long_to_wait(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    set_limits(engine, db_now, rate_per_sec=2.0, rate_burst=4)
    fill(engine, db_now, 20)

    assert len(limited(engine, client_id, db_now).jobs) == 4
    empty = limited(engine, client_id, db_now)
    assert (empty.jobs, empty.wait) == ([], dt.timedelta(seconds=0.5))
    assert len(limited(engine, client_id, db_now + SECOND).jobs) == 2
    # The bucket never holds more than the burst.
    assert len(limited(engine, client_id, db_now + HOUR).jobs) == 4


def test_rate_limit__burst_defaults_to_one_seconds_worth(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    set_limits(engine, db_now, rate_per_sec=2.5)
    fill(engine, db_now, 20)

    assert len(limited(engine, client_id, db_now).jobs) == 3


def test_partition_limit__caps_running_jobs_per_partition_key(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    set_limits(engine, db_now, partition_limit=1)
    fill(engine, db_now, 3, partition_key="a")
    fill(engine, db_now, 2, partition_key="b")
    fill(engine, db_now, 1)

    got = limited(engine, client_id, db_now).jobs
    assert sorted(str(j.partition_key) for j in got) == ["None", "a", "b"]
    assert limited(engine, client_id, db_now).jobs == []

    finalize(engine, db_now, result(next(j for j in got if j.partition_key == "a"), "completed"))
    (nxt,) = limited(engine, client_id, db_now).jobs
    assert nxt.partition_key == "a"


def test_limits__an_unlimited_claim_of_a_limited_queue_takes_nothing(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    set_limits(engine, db_now, global_limit=5)
    fill(engine, db_now, 2)

    assert claim(engine, client_id, db_now, queue=Q) == []
    assert len(limited(engine, client_id, db_now).jobs) == 2


def test_limits__a_paused_limited_queue_yields_nothing(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    set_limits(engine, db_now, global_limit=5)
    controls(engine).queue_pause(Q, now=db_now)
    fill(engine, db_now, 2)

    assert limited(engine, client_id, db_now).jobs == []


def test_limits__zero_removes_a_limit_and_renewals_list_limited_queues(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    renew = ClientRenewParams(client_id=client_id, ttl=HOUR, now=db_now)
    set_limits(engine, db_now, rate_per_sec=1.0, global_limit=2, aging=dt.timedelta(minutes=5))
    assert Q in engine.client_renew(renew).limited_queues
    row = controls(engine).queue_get(Q)
    assert row is not None
    assert (row.limits.rate_per_sec, row.limits.global_limit) == (1.0, 2)
    assert row.limits.aging == dt.timedelta(minutes=5)

    set_limits(engine, db_now)

    assert Q not in engine.client_renew(renew).limited_queues
    fill(engine, db_now, 1)
    assert len(claim(engine, client_id, db_now, queue=Q)) == 1


def test_limits__a_limited_claim_of_an_unknown_queue_claims_as_usual(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    fill(engine, db_now, 2)

    assert len(limited(engine, client_id, db_now).jobs) == 2


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"global_limit": -1}, "global_limit"),
        ({"partition_limit": "3"}, "partition_limit"),
        ({"rate_burst": 1.5}, "rate_burst"),
        ({"rate_burst": 5}, "rate_burst"),  # a burst needs a rate
        ({"rate_per_sec": -0.5}, "rate_per_sec"),
        ({"rate_per_sec": "fast"}, "rate_per_sec"),
        ({"rate_per_sec": float("nan")}, "rate_per_sec"),
        ({"aging": -SECOND}, "aging"),
    ],
)
def test_set_limits__bad_values_are_refused_naming_the_field_and_nothing_is_written(
    engine: BaseEngine, db_now: dt.datetime, fields: dict, field: str
) -> None:
    with pytest.raises(InvalidJob) as err:
        set_limits(engine, db_now, **fields)

    assert err.value.field == field
    assert not Queue.objects.filter(name=Q).exists()


def test_set_limits__an_empty_queue_name_is_an_unknown_queue(engine: BaseEngine) -> None:
    with pytest.raises(UnknownQueue):
        controls(engine).queue_set_limits(QueueLimits(name="", global_limit=1))
