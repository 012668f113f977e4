"""Pause, resume, aging and stats."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRenewParams,
    JobAgeParams,
    JobInsertParams,
    LeaderParams,
)
from django_hopper.exceptions import InvalidJob, UnknownQueue
from django_hopper.models import Job
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim,
    finalize,
    get,
    insert,
    insert_many,
    result,
)


def controls(engine: BaseEngine) -> BaseEngine:
    return engine


def test_pause__creates_the_queue_stops_claims_and_renewals_report_it(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now, queue="p")
    controls(engine).queue_pause("p", now=db_now)
    controls(engine).queue_pause("p", now=db_now + MINUTE)

    assert claim(engine, client_id, db_now, queue="p") == []
    row = controls(engine).queue_get("p")
    assert row is not None and row.paused_at == db_now
    renewal = engine.client_renew(ClientRenewParams(client_id=client_id, ttl=HOUR, now=db_now))
    assert "p" in renewal.paused_queues


def test_resume__restarts_claims_and_creates_an_unknown_queue(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now, queue="p")
    controls(engine).queue_pause("p", now=db_now)
    controls(engine).queue_resume("p", now=db_now)
    controls(engine).queue_resume("fresh", now=db_now)

    assert len(claim(engine, client_id, db_now, queue="p")) == 1
    assert {q.name for q in engine.queue_list()} >= {"p", "fresh"}
    row = controls(engine).queue_get("p")
    assert row is not None and row.paused_at is None


def test_pause__an_empty_name_is_an_unknown_queue(engine: BaseEngine) -> None:
    with pytest.raises(UnknownQueue):
        controls(engine).queue_pause("")
    with pytest.raises(UnknownQueue):
        controls(engine).queue_resume("")


def test_job_age__raises_long_claimable_jobs_one_level_capped_at_100(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    old = insert(engine, db_now - HOUR, queue="a", priority=-5)
    top = insert(engine, db_now - HOUR, queue="a", priority=100)
    due = insert(engine, db_now - HOUR, queue="a", scheduled_at=db_now - 30 * MINUTE)
    fresh = insert(engine, db_now, queue="a")
    later = insert(engine, db_now - HOUR, queue="a", scheduled_at=db_now + HOUR)
    elsewhere = insert(engine, db_now - HOUR, queue="b")
    Job.objects.filter(id=due.id).update(state="scheduled")

    aged = controls(engine).job_age(JobAgeParams(queue="a", after=10 * MINUTE, now=db_now))

    assert aged == 2
    assert [get(engine, j).priority for j in (old, top, due, fresh, later, elsewhere)] == [
        -4, 100, 1, 0, 0, 0,
    ]  # fmt: skip


def test_job_age__a_non_positive_interval_is_refused(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob) as err:
        controls(engine).job_age(JobAgeParams(queue="a", after=dt.timedelta(0)))
    assert err.value.field == "after"


def test_stats__depths_oldest_claimable_completions_pause_and_cluster_state(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    insert_many(engine, [JobInsertParams(kind="tests.job", queue="s")] * 3, db_now - MINUTE)
    insert(engine, db_now, queue="s", scheduled_at=db_now + HOUR)
    done, _running = claim(engine, client_id, db_now, queue="s", limit=2)
    finalize(engine, db_now, result(done, "completed"))

    controls(engine).queue_pause("idle", now=db_now)
    engine.leader_attempt(LeaderParams(client_id=other_client_id, ttl=HOUR, now=db_now))

    stats = controls(engine).stats(now=db_now + SECOND)

    s = stats.queues["s"]
    assert (s.available, s.scheduled, s.retryable, s.running) == (1, 1, 0, 1)
    assert s.oldest_available == MINUTE + SECOND
    assert s.completed_last_minute == 1
    assert not s.paused
    assert stats.queues["idle"].paused
    assert stats.live_clients == 2
    assert stats.leader == other_client_id
    assert stats.running_by_client == {client_id: 1}
    assert controls(engine).stats(now=db_now + 2 * MINUTE).queues["s"].completed_last_minute == 0


def test_stats__adds_the_unarchived_completions_live_clients_report(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    insert(engine, db_now, queue="r")
    (done,) = claim(engine, client_id, db_now, queue="r", limit=1)
    finalize(engine, db_now, result(done, "completed"))  # archived: counted from history
    for cid, report in ((client_id, {"r": 2, "gone": 1}), (other_client_id, {"r": 3})):
        renewed = engine.client_renew(
            ClientRenewParams(client_id=cid, ttl=MINUTE, completed=report, now=db_now)
        )
        assert renewed.renewed
    # A renewal without a report keeps the last one.
    engine.client_renew(ClientRenewParams(client_id=client_id, ttl=MINUTE, now=db_now))

    stats = controls(engine).stats(now=db_now + SECOND)
    assert stats.queues["r"].completed_last_minute == 1 + 2 + 3
    assert stats.queues["gone"].completed_last_minute == 1
    assert stats.queues["gone"].available == 0

    # An empty report replaces the last one; an expired client's report no longer counts.
    engine.client_renew(
        ClientRenewParams(client_id=other_client_id, ttl=SECOND, completed={}, now=db_now)
    )
    assert controls(engine).stats(now=db_now + SECOND).queues["r"].completed_last_minute == 1 + 2
    later = controls(engine).stats(now=db_now + 2 * MINUTE).queues
    assert "gone" not in later
    assert "r" not in later or later["r"].completed_last_minute == 0
