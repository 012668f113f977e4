"""``hopper_maintain --once``: runs as the leader, waits for background builds, resigns."""

from __future__ import annotations

import datetime as dt
import io
import threading
import time
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError
from django.test import override_settings

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobInsertOpts, JobInsertParams, LeaderParams
from django_hopper.maintenance import HistoryIndexer
from django_hopper.models import Client, Job
from django_hopper.queues import set_queue_limits
from tests.maintenance.conftest import register_client

pytestmark = pytest.mark.django_db(transaction=True)


def _aged_queue(engine: BaseEngine) -> None:
    """A queue with aging and a job that has waited long enough to gain a level."""
    set_queue_limits("aged", aging=60)
    engine.job_insert_many(
        [JobInsertParams(kind="tests.aging", queue="aged")],
        JobInsertOpts(now=engine.now() - dt.timedelta(minutes=5)),
    )


def _priority() -> int:
    return int(Job.objects.get(queue="aged").priority)


def test_once__runs_every_service_as_leader_then_resigns_and_leaves_no_client(
    tx_engine: BaseEngine,
) -> None:
    _aged_queue(tx_engine)
    out = io.StringIO()
    call_command("hopper_maintain", "--once", stdout=out)
    assert _priority() == 1
    assert "rescue: 0" in out.getvalue() and "age: 1" in out.getvalue()
    assert tx_engine.leader_get() is None
    assert not Client.objects.exists()


def test_once__waits_for_the_history_index_build_it_started(
    tx_engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = threading.Event()

    def slow_build(self: HistoryIndexer) -> Any:
        time.sleep(0.5)
        finished.set()

    monkeypatch.setattr(HistoryIndexer, "build", slow_build)
    call_command("hopper_maintain", "--once", stdout=io.StringIO())
    assert finished.is_set()


def test_once__a_failed_lease_renewal_is_logged_and_retried_on_a_fresh_connection(
    tx_engine: BaseEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    renew = tx_engine.client_renew
    calls: list[int] = []
    renewed_after_failure = threading.Event()

    def flaky_renew(params: Any) -> Any:
        calls.append(params.client_id)
        if len(calls) == 1:
            raise DatabaseError("connection lost")
        renewed_after_failure.set()
        return renew(params)

    def slow_build(self: HistoryIndexer) -> Any:
        assert renewed_after_failure.wait(10), "the renewal was not retried"

    monkeypatch.setattr(tx_engine, "client_renew", flaky_renew)
    monkeypatch.setattr(HistoryIndexer, "build", slow_build)
    hopper = {"QUEUES": {"default": 10}, "CLIENT_TTL": 0.3, "LEADER_TTL": 0.3}
    with override_settings(HOPPER=hopper):
        call_command("hopper_maintain", "--once", stdout=io.StringIO())

    assert len(calls) >= 2
    assert "renewing the maintenance pass's leases failed" in caplog.text


def test_once__refuses_with_status_3_while_another_client_leads(tx_engine: BaseEngine) -> None:
    _aged_queue(tx_engine)
    other = register_client(tx_engine, tx_engine.now())
    assert tx_engine.leader_attempt(LeaderParams(client_id=other, ttl=dt.timedelta(minutes=1)))

    with pytest.raises(CommandError, match="holds the leader lease") as raised:
        call_command("hopper_maintain", "--once", stdout=io.StringIO())
    assert raised.value.returncode == 3
    assert _priority() == 0  # the live leader ages the queue; the pass did not age it twice
    assert tx_engine.leader_get() == other
    assert list(Client.objects.values_list("id", flat=True)) == [other]


def test_once__with_force_runs_beside_a_live_leader_and_leaves_its_lease(
    tx_engine: BaseEngine,
) -> None:
    _aged_queue(tx_engine)
    other = register_client(tx_engine, tx_engine.now())
    assert tx_engine.leader_attempt(LeaderParams(client_id=other, ttl=dt.timedelta(minutes=1)))

    err = io.StringIO()
    call_command("hopper_maintain", "--once", "--force", stdout=io.StringIO(), stderr=err)
    assert "--force" in err.getvalue()
    assert _priority() == 1
    assert tx_engine.leader_get() == other


def test_once__with_wait_takes_the_lease_once_the_leader_resigns(tx_engine: BaseEngine) -> None:
    other = register_client(tx_engine, tx_engine.now())
    assert tx_engine.leader_attempt(LeaderParams(client_id=other, ttl=dt.timedelta(minutes=1)))
    timer = threading.Timer(0.5, tx_engine.leader_resign, args=(other,))
    timer.start()
    try:
        call_command("hopper_maintain", "--once", "--wait", "10", stdout=io.StringIO())
    finally:
        timer.join()
    assert tx_engine.leader_get() is None


def test_force_without_once__is_refused() -> None:
    with pytest.raises(CommandError, match="only apply to --once"):
        call_command("hopper_maintain", "--force")
