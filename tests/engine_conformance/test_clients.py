"""Clients (leases, renewal control state, prune), the leader lease, queues and notify."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from django.db import transaction

from django_hopper.engine.base import BaseEngine, Listener
from django_hopper.engine.params import (
    ClientRegisterParams,
    ClientRenewParams,
    JobCancelParams,
    JobDeleteParams,
    JobInsertOpts,
    JobInsertParams,
    JobRetryParams,
    LeaderParams,
)
from django_hopper.models import Leader, Queue
from django_hopper.types import (
    CHANNEL_CONTROL,
    CHANNEL_DONE,
    CHANNEL_INSERT,
    CHANNEL_LEADER,
    Notification,
)
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    finalize,
    insert,
    insert_many,
    receive,
    register,
    result,
    running,
)
from tests.factories import ClientFactory, QueueFactory

# -- clients -----------------------------------------------------------------------------


def test_client_register__creates_a_lease_from_database_now(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    client_id = engine.client_register(
        ClientRegisterParams(hostname="box-1", ttl=MINUTE, info={"pid": 42}, now=db_now)
    )

    (row,) = [c for c in engine.client_list() if c.id == client_id]
    assert row.hostname == "box-1"
    assert row.started_at == db_now
    assert row.expires_at == db_now + MINUTE
    assert row.info == {"pid": 42}


def test_client_register__gives_each_client_its_own_id(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    ids = {register(engine, db_now) for _ in range(3)}

    assert len(ids) == 3
    assert ids <= {c.id for c in engine.client_list()}


def test_client_renew__extends_a_live_lease(engine: BaseEngine, db_now: dt.datetime) -> None:
    client_id = register(engine, db_now, ttl=MINUTE)
    at = db_now + 30 * SECOND

    renewed = engine.client_renew(ClientRenewParams(client_id=client_id, ttl=2 * MINUTE, now=at))

    assert renewed.renewed is True
    (row,) = [c for c in engine.client_list() if c.id == client_id]
    assert row.expires_at == at + 2 * MINUTE
    assert row.started_at == db_now


def test_client_renew__is_refused_once_the_lease_expired(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    client_id = register(engine, db_now, ttl=MINUTE)

    renewed = engine.client_renew(
        ClientRenewParams(client_id=client_id, ttl=MINUTE, now=db_now + MINUTE)
    )

    assert renewed.renewed is False
    (row,) = [c for c in engine.client_list() if c.id == client_id]
    assert row.expires_at == db_now + MINUTE


def test_client_renew__is_refused_for_an_unknown_client(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    renewed = engine.client_renew(ClientRenewParams(client_id=987654, ttl=MINUTE, now=db_now))

    assert renewed.renewed is False


def test_client_renew__lists_its_running_jobs_with_a_cancel_request(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    to_cancel = running(engine, client_id, db_now)
    running(engine, client_id, db_now)
    someone_elses = running(engine, other_client_id, db_now)
    for job in (to_cancel, someone_elses):
        engine.job_cancel(JobCancelParams(id=job.id, now=db_now))

    renewed = engine.client_renew(ClientRenewParams(client_id=client_id, ttl=HOUR, now=db_now))

    assert renewed.renewed is True
    assert renewed.cancel_requested == [to_cancel.id]


def test_client_renew__lists_paused_and_limited_queues(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    QueueFactory(now=db_now, name="paused-1", paused=True)
    QueueFactory(now=db_now, name="paused-2", paused=True)
    QueueFactory(now=db_now, name="limited", limited=True)
    QueueFactory(now=db_now, name="rated", rate_per_sec=2.0)
    QueueFactory(now=db_now, name="plain")

    renewed = engine.client_renew(ClientRenewParams(client_id=client_id, ttl=HOUR, now=db_now))

    assert sorted(renewed.paused_queues) == ["paused-1", "paused-2"]
    assert sorted(renewed.limited_queues) == ["limited", "rated"]


def test_client_renew__returns_control_state_even_when_refused(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    client_id = register(engine, db_now, ttl=MINUTE)
    job = running(engine, client_id, db_now)
    engine.job_cancel(JobCancelParams(id=job.id, now=db_now))
    QueueFactory(now=db_now, name="paused", paused=True)

    renewed = engine.client_renew(
        ClientRenewParams(client_id=client_id, ttl=MINUTE, now=db_now + HOUR)
    )

    assert renewed.renewed is False
    assert renewed.cancel_requested == [job.id]
    assert renewed.paused_queues == ["paused"]


def test_client_delete__removes_the_lease(engine: BaseEngine, db_now: dt.datetime) -> None:
    gone = register(engine, db_now)
    kept = register(engine, db_now)

    engine.client_delete(gone)

    ids = {c.id for c in engine.client_list()}
    assert gone not in ids
    assert kept in ids


def test_client_prune_expired__removes_only_expired_leases(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    expired = register(engine, db_now, ttl=MINUTE)
    at_expiry = register(engine, db_now - MINUTE, ttl=2 * MINUTE)
    live = register(engine, db_now, ttl=HOUR)
    old = ClientFactory(now=db_now, expired=True)

    pruned = engine.client_prune_expired(now=db_now + MINUTE)

    assert pruned == 3
    ids = {c.id for c in engine.client_list()}
    assert live in ids
    assert not ids & {expired, at_expiry, old.id}


def test_client_list__includes_expired_clients(engine: BaseEngine, db_now: dt.datetime) -> None:
    old = ClientFactory(now=db_now, expired=True, hostname="old-box")

    (row,) = [c for c in engine.client_list() if c.id == old.id]

    assert row.hostname == "old-box"
    assert row.expires_at < db_now


# -- leader -------------------------------------------------------------------------------


def lead(engine: BaseEngine, client_id: int, now: dt.datetime, ttl: dt.timedelta = MINUTE) -> bool:
    return engine.leader_attempt(LeaderParams(client_id=client_id, ttl=ttl, now=now))


def test_leader__the_first_client_to_ask_leads(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    assert engine.leader_get(now=db_now) is None

    assert lead(engine, client_id, db_now) is True
    assert lead(engine, other_client_id, db_now) is False
    assert engine.leader_get(now=db_now) == client_id


def test_leader__the_leader_renews_its_lease(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    lead(engine, client_id, db_now)

    assert lead(engine, client_id, db_now + 50 * SECOND) is True
    # The renewal runs from its own time: still the leader after the first TTL.
    assert lead(engine, other_client_id, db_now + 70 * SECOND) is False
    assert engine.leader_get(now=db_now + 70 * SECOND) == client_id


def test_leader__an_expired_lease_is_taken_over(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    lead(engine, client_id, db_now)

    assert engine.leader_get(now=db_now + MINUTE) is None
    assert lead(engine, other_client_id, db_now + MINUTE) is True
    assert engine.leader_get(now=db_now + MINUTE) == other_client_id
    assert lead(engine, client_id, db_now + MINUTE) is False


def test_leader__elected_at_changes_only_when_leadership_changes_hands(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    lead(engine, client_id, db_now)
    lead(engine, client_id, db_now + 30 * SECOND)

    row = Leader.objects.get(name="default")
    assert (row.client_id, row.elected_at, row.expires_at) == (
        client_id,
        db_now,
        db_now + 30 * SECOND + MINUTE,
    )

    lead(engine, other_client_id, db_now + 2 * MINUTE)

    row = Leader.objects.get(name="default")
    assert (row.client_id, row.elected_at) == (other_client_id, db_now + 2 * MINUTE)


def test_leader__resign_frees_the_lease_for_another_client(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    lead(engine, client_id, db_now)

    engine.leader_resign(client_id)

    assert engine.leader_get(now=db_now) is None
    assert lead(engine, other_client_id, db_now) is True


def test_leader__resign_by_a_client_that_does_not_lead_changes_nothing(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    lead(engine, client_id, db_now)

    engine.leader_resign(other_client_id)

    assert engine.leader_get(now=db_now) == client_id


def test_leader__resign_without_a_leader_is_harmless(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    engine.leader_resign(client_id)

    assert engine.leader_get(now=db_now) is None


# -- queues -------------------------------------------------------------------------------


def test_queue_ensure__records_queues_once(engine: BaseEngine, db_now: dt.datetime) -> None:
    engine.queue_ensure(["alpha", "beta"], now=db_now)
    engine.queue_ensure(["beta", "gamma"], now=db_now + MINUTE)

    rows = {q.name: q for q in engine.queue_list()}

    assert set(rows) == {"alpha", "beta", "gamma"}
    assert rows["beta"].updated_at == db_now
    assert rows["gamma"].updated_at == db_now + MINUTE
    assert all(q.paused_at is None for q in rows.values())
    assert Queue.objects.get(name="alpha").created_at == db_now


def test_queue_ensure__keeps_an_existing_queue_paused(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    QueueFactory(now=db_now - HOUR, name="held", paused=True)

    engine.queue_ensure(["held"], now=db_now)

    (row,) = [q for q in engine.queue_list() if q.name == "held"]
    assert row.paused_at == Queue.objects.get(name="held").paused_at
    assert row.paused_at is not None


def test_queue_list__reports_pause_and_limits(engine: BaseEngine, db_now: dt.datetime) -> None:
    QueueFactory(
        now=db_now,
        name="busy",
        global_limit=4,
        rate_per_sec=2.5,
        rate_burst=5,
        partition_limit=1,
        aging=dt.timedelta(minutes=10),
    )
    paused = QueueFactory(now=db_now, name="held", paused=True)

    rows = {q.name: q for q in engine.queue_list()}

    busy = rows["busy"].limits
    assert (busy.name, busy.global_limit, busy.rate_per_sec, busy.rate_burst) == (
        "busy",
        4,
        2.5,
        5,
    )
    assert busy.partition_limit == 1
    assert busy.aging == dt.timedelta(minutes=10)
    assert busy.limited is True
    assert rows["busy"].paused_at is None
    assert rows["held"].paused_at == paused.paused_at
    assert rows["held"].limits.limited is False


# -- notify ---------------------------------------------------------------------------------


def test_notify__sends_without_error(engine: BaseEngine) -> None:
    engine.notify(CHANNEL_INSERT, ["default", "other"])
    engine.notify(CHANNEL_CONTROL, [])


def test_listener__is_not_supported_without_listen(engine: BaseEngine) -> None:
    if engine.features.supports_listen:
        pytest.skip("engine supports listen")
    from django_hopper.exceptions import NotSupported

    with pytest.raises(NotSupported):
        engine.listener()


@pytest.fixture
def listening(tx_engine: BaseEngine) -> Iterator[Listener]:
    """A listener on every hopper channel (engines with ``supports_listen`` only)."""
    if not tx_engine.features.supports_listen:
        pytest.skip("engine has no listen")
    listener = tx_engine.listener()
    try:
        listener.listen([CHANNEL_INSERT, CHANNEL_CONTROL, CHANNEL_DONE, CHANNEL_LEADER])
        yield listener
    finally:
        listener.close()


def test_notify__a_listener_receives_a_committed_notification(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    with transaction.atomic():
        tx_engine.notify(CHANNEL_CONTROL, ["one", "two"])

    got = receive(listening, 2)

    assert got == [Notification(CHANNEL_CONTROL, "one"), Notification(CHANNEL_CONTROL, "two")]


def test_notify__is_delivered_only_at_commit(tx_engine: BaseEngine, listening: Listener) -> None:
    with transaction.atomic():
        tx_engine.notify(CHANNEL_CONTROL, ["inside"])
        early = listening.next(0.2)
    late = receive(listening, 1)

    assert early == []
    assert late == [Notification(CHANNEL_CONTROL, "inside")]


def test_notify__a_rolled_back_notification_is_never_delivered(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        tx_engine.notify(CHANNEL_CONTROL, ["lost"])
        raise Rollback
    with transaction.atomic():
        tx_engine.notify(CHANNEL_CONTROL, ["kept"])

    assert receive(listening, 2, timeout=1.0) == [Notification(CHANNEL_CONTROL, "kept")]


def test_notify__insert_with_notify_announces_each_queue_once(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    now = tx_engine.now()
    insert_many(
        tx_engine,
        [
            JobInsertParams(kind="tests.n", queue="qa"),
            JobInsertParams(kind="tests.n", queue="qb"),
            JobInsertParams(kind="tests.n", queue="qa"),
        ],
        now,
        notify=True,
    )

    got = receive(listening, 3, timeout=1.0)

    assert sorted(n.payload for n in got if n.channel == CHANNEL_INSERT) == ["qa", "qb"]


def test_notify__one_job_on_the_database_clock_announces_its_queue(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    """The insert of a plain enqueue() (one job at its defaults, no ``now``) wakes its queue."""
    tx_engine.job_insert_many(
        [JobInsertParams(kind="tests.n", queue="q1")], JobInsertOpts(notify=True)
    )

    got = receive(listening, 1, timeout=1.0)

    assert [n.payload for n in got if n.channel == CHANNEL_INSERT] == ["q1"]


def test_notify__insert_announces_only_queues_that_got_an_available_job(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    now = tx_engine.now()
    insert(tx_engine, now, kind="tests.n", queue="qd", unique_key="k")
    while receive(listening, 1, timeout=0.2):
        pass

    insert_many(
        tx_engine,
        [
            JobInsertParams(kind="tests.n", queue="qs", scheduled_at=now + HOUR),
            JobInsertParams(kind="tests.n", queue="qd", unique_key="k"),
            JobInsertParams(kind="tests.n", queue="qa"),
        ],
        now,
        notify=True,
    )

    got = receive(listening, 3, timeout=1.0)
    assert [n.payload for n in got if n.channel == CHANNEL_INSERT] == ["qa"]


def test_notify__retry_announces_the_queue(tx_engine: BaseEngine, listening: Listener) -> None:
    now = tx_engine.now()
    job = insert(tx_engine, now, queue="again", scheduled_at=now + HOUR)

    tx_engine.job_retry(JobRetryParams(id=job.id, now=now))

    got = receive(listening, 1)
    assert [n.payload for n in got if n.channel == CHANNEL_INSERT] == ["again"]


def test_notify__deleting_an_awaited_waiting_job_announces_it_done(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    now = tx_engine.now()
    job = insert(tx_engine, now, awaited=True)

    tx_engine.job_delete(JobDeleteParams(id=job.id, now=now))

    got = receive(listening, 1)
    assert [n for n in got if n.channel == CHANNEL_DONE] == [
        Notification(CHANNEL_DONE, str(job.id))
    ]


def test_notify__cancel_of_a_running_job_signals_its_client(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    job = running(tx_engine, client_id, now)

    tx_engine.job_cancel(JobCancelParams(id=job.id, now=now))

    (got,) = [n for n in receive(listening, 1) if n.channel == CHANNEL_CONTROL]
    assert json.loads(got.payload) == {"action": "cancel", "job_id": str(job.id)}


def test_notify__an_awaited_job_announces_its_finalize(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    job = running(tx_engine, client_id, now, awaited=True)
    plain = running(tx_engine, client_id, now)

    finalize(tx_engine, now, result(plain, "completed"), result(job, "completed"))

    got = [n for n in receive(listening, 2, timeout=1.0) if n.channel == CHANNEL_DONE]
    assert got == [Notification(CHANNEL_DONE, str(job.id))]


def test_notify__leader_resign_signals_an_election(
    tx_engine: BaseEngine, listening: Listener
) -> None:
    now = tx_engine.now()
    client_id = register(tx_engine, now)
    tx_engine.leader_attempt(LeaderParams(client_id=client_id, ttl=MINUTE, now=now))

    tx_engine.leader_resign(client_id)

    assert CHANNEL_LEADER in [n.channel for n in receive(listening, 1)]
