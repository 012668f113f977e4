"""stats_bounded: the depths stats reads, each count stopped at a limit."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobInsertParams, LeaderParams, StatsBoundedParams
from django_hopper.exceptions import InvalidJob
from django_hopper.models import Job
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim,
    finalize,
    insert,
    insert_many,
    result,
)


def mixed_queues(engine: BaseEngine, db_now: dt.datetime, client_id: int) -> None:
    """Fill queues with every state, priority, key and schedule the oldest job can hide in."""
    insert_many(engine, [JobInsertParams(kind="tests.job", queue="s")] * 3, db_now - MINUTE)
    insert(engine, db_now, queue="s", scheduled_at=db_now + HOUR)
    done, _running = claim(engine, client_id, db_now, queue="s", limit=2)
    finalize(engine, db_now, result(done, "completed"))
    # The oldest waiting job of "p" has the lowest of three priorities.
    insert(engine, db_now - 5 * MINUTE, queue="p", priority=-3)
    insert(engine, db_now - MINUTE, queue="p", priority=7)
    insert(engine, db_now - 2 * MINUTE, queue="p", priority=0)
    # "k": keyed jobs only, the oldest one keyed and scheduled but due.
    insert(engine, db_now - 3 * MINUTE, queue="k", ordering_key="a")
    keyed = insert(engine, db_now - 9 * MINUTE, queue="k", ordering_key="b", priority=2)
    Job.objects.filter(id=keyed.id).update(state="scheduled")
    # "d": a retryable job due for 20 minutes, an expired one older still, a future one.
    due = insert(engine, db_now - HOUR, queue="d", scheduled_at=db_now - 20 * MINUTE)
    Job.objects.filter(id=due.id).update(state="retryable")
    insert(engine, db_now - HOUR, queue="d", ttl=SECOND)
    insert(engine, db_now, queue="d", scheduled_at=db_now + MINUTE)
    # "w": a pending job only (a workflow step waiting for its dependencies).
    pending = insert(engine, db_now, queue="w")
    Job.objects.filter(id=pending.id).update(state="pending")
    engine.queue_pause("idle", now=db_now)


def test_stats_bounded__below_the_limit_reads_exactly_what_stats_reads(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    mixed_queues(engine, db_now, client_id)
    engine.leader_attempt(LeaderParams(client_id=other_client_id, ttl=HOUR, now=db_now))
    at = db_now + SECOND

    exact = engine.stats(now=at)
    bounded = engine.stats_bounded(StatsBoundedParams(limit=100, now=at))

    assert bounded == exact
    assert set(bounded.queues) == {"s", "p", "k", "d", "w", "idle"}
    assert bounded.queues["p"].oldest_available == 5 * MINUTE + SECOND
    assert bounded.queues["k"].oldest_available == 9 * MINUTE + SECOND
    assert bounded.queues["d"].oldest_available == 20 * MINUTE + SECOND
    assert all(q.capped == () for q in bounded.queues.values())
    assert bounded.leader == other_client_id
    assert bounded.running_by_client == {client_id: 1}


def test_stats_bounded__a_count_that_reaches_the_limit_stops_there_and_says_so(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert_many(engine, [JobInsertParams(kind="tests.job", queue="c")] * 5, db_now - MINUTE)
    insert_many(engine, [JobInsertParams(kind="tests.job", queue="c")] * 3, db_now - MINUTE)
    claim(engine, client_id, db_now, queue="c", limit=3)
    insert(engine, db_now, queue="c", scheduled_at=db_now + HOUR)
    at = db_now + SECOND

    exact = engine.stats(now=at).queues["c"]
    c = engine.stats_bounded(StatsBoundedParams(limit=3, now=at)).queues["c"]

    assert (exact.available, exact.running, exact.scheduled) == (5, 3, 1)
    assert (c.available, c.running, c.scheduled, c.retryable) == (3, 3, 1, 0)
    assert c.capped == ("available",)
    assert dataclasses.replace(c, available=5, capped=()) == exact


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (StatsBoundedParams(limit=0), "limit"),
        (StatsBoundedParams(limit=-1), "limit"),
        (StatsBoundedParams(limit=True), "limit"),
        (StatsBoundedParams(limit="10"), "limit"),  # type: ignore[arg-type]
        (StatsBoundedParams(now=dt.datetime(2026, 1, 1)), "now"),
    ],
)
def test_stats_bounded__refuses_a_bad_limit_or_clock_naming_it(
    engine: BaseEngine, params: StatsBoundedParams, field: str
) -> None:
    with pytest.raises(InvalidJob) as err:
        engine.stats_bounded(params)
    assert err.value.field == field
