"""``task_finished`` for tasks hopper ends itself (rescue, TTL expiry), and the
worker's ``--database`` for a backend that stores tasks on another alias."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import ClientRegisterParams, JobClaimParams
from django_hopper.maintenance import (
    ExpiredJobDiscarder,
    PeriodicEnqueuer,
    Rescuer,
    default_services,
)
from django_hopper.tasks_compat import TaskResultStatus, task_backends, task_finished
from tests.tasks_backend import tasks


class Finished:
    """Collects the ``task_finished`` signals sent during a test."""

    def __init__(self) -> None:
        self.results: list[Any] = []

    def __enter__(self) -> Finished:
        task_finished.connect(self.receive, weak=False, dispatch_uid="hopper-endings")
        return self

    def __exit__(self, *exc: object) -> None:
        task_finished.disconnect(dispatch_uid="hopper-endings")

    def receive(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        self.results.append(task_result)


def claim_and_lose_the_worker(engine: BaseEngine) -> None:
    """Claim the waiting tasks under a client whose lease then vanishes (a killed worker)."""
    client = engine.client_register(
        ClientRegisterParams(hostname="test", ttl=dt.timedelta(minutes=5))
    )
    engine.job_claim(JobClaimParams(queue="default", client_id=client, limit=10))
    engine.client_delete(client)


def test_a_task_the_rescue_ends_for_good_sends_task_finished_failed(engine: BaseEngine) -> None:
    result = tasks.add.enqueue(1, 2)
    claim_and_lose_the_worker(engine)

    with Finished() as finished:
        assert Rescuer(engine).run_once() == 1

    (sent,) = finished.results
    assert sent.id == result.id
    assert sent.status == TaskResultStatus.FAILED
    assert sent.finished_at is not None
    assert "stopped renewing its lease" in sent.errors[-1].traceback
    assert tasks.add.get_result(result.id).status == TaskResultStatus.FAILED


def test_a_task_the_rescue_makes_retryable_is_not_finished(engine: BaseEngine) -> None:
    tasks.flaky.enqueue(1)  # three attempts: the rescue schedules a retry
    claim_and_lose_the_worker(engine)

    with Finished() as finished:
        assert Rescuer(engine).run_once() == 1
    assert finished.results == []


def test_a_task_past_its_ttl_sends_task_finished_failed(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    result = tasks.add.using(ttl=60).enqueue(1, 2)

    with Finished() as finished:
        assert ExpiredJobDiscarder(engine).run_once(now=db_now + dt.timedelta(minutes=5)) == 1

    (sent,) = finished.results
    assert (sent.id, sent.status) == (result.id, TaskResultStatus.FAILED)


def test_a_failing_task_finished_receiver_does_not_stop_the_rescue(engine: BaseEngine) -> None:
    tasks.add.enqueue(1, 2)
    claim_and_lose_the_worker(engine)

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_finished.connect(broken, weak=False, dispatch_uid="broken")
    try:
        assert Rescuer(engine).run_once() == 1
    finally:
        task_finished.disconnect(dispatch_uid="broken")


# ---------------------------------------------------------------------------
# OPTIONS["database"]: a check, and a worker for that alias


def test_check_warns_when_tasks_are_stored_on_another_database_than_hoppers(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(connections.settings, "other", dict(connections.settings["default"]))
    settings.TASKS = {
        "default": {
            "BACKEND": "django_hopper.tasks.backend.HopperBackend",
            "OPTIONS": {"database": "other"},
        }
    }
    messages = {m.id: m for m in task_backends["default"].check()}
    assert "hopper.W702" in messages
    assert "hopper_worker --database other" in messages["hopper.W702"].hint


def test_hopper_worker_runs_the_jobs_of_the_database_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_hopper import schema
    from django_hopper.management.commands import hopper_worker

    seen: dict[str, Any] = {}

    class FakeWorker:
        stranded = 0

        def __init__(self, config: Any, engine: Any) -> None:
            seen["engine"] = engine

        def run(self) -> int:
            return 0

    # The command holds its own references to get_engine and Worker: patch those.
    def fake_engine(alias: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(alias=alias)

    monkeypatch.setattr(hopper_worker, "get_engine", fake_engine)
    monkeypatch.setattr(hopper_worker, "Worker", FakeWorker)
    monkeypatch.setattr(schema, "check", lambda alias: None)
    call_command("hopper_worker", "--database", "default", "--queues", "default:1")
    assert seen["engine"].alias == "default"


def test_hopper_worker_refuses_an_unknown_database() -> None:
    with pytest.raises(CommandError, match="'nope' is not in DATABASES"):
        call_command("hopper_worker", "--database", "nope")


def test_a_leader_of_another_database_does_not_insert_periodic_jobs(engine: BaseEngine) -> None:
    other = SimpleNamespace(alias="other")
    services = default_services(other, lambda: 1)  # type: ignore[arg-type]
    assert not any(isinstance(s, PeriodicEnqueuer) for s in services)
    assert any(isinstance(s, PeriodicEnqueuer) for s in default_services(engine, lambda: 1))


def test_cancelling_a_waiting_task_sends_task_finished_failed_after_commit(
    engine: BaseEngine, django_capture_on_commit_callbacks: Any
) -> None:
    import django_hopper

    result = tasks.add.enqueue(1, 2)
    with Finished() as finished:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            django_hopper.cancel_job(result.id)
            assert finished.results == []  # not before the cancel commits
        assert len(callbacks) == 1

    (sent,) = finished.results
    assert sent.id == result.id
    assert sent.status == TaskResultStatus.FAILED


def test_cancelling_a_plain_job_or_a_finished_task_sends_nothing(
    engine: BaseEngine, django_capture_on_commit_callbacks: Any
) -> None:
    import django_hopper
    from tests.testapp import jobs

    plain = jobs.add.enqueue(1, 2)
    result = tasks.add.enqueue(1, 2)
    with django_capture_on_commit_callbacks(execute=True):
        django_hopper.cancel_job(result.id)
    with Finished() as finished:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            django_hopper.cancel_job(plain.id)
            django_hopper.cancel_job(result.id)  # already canceled: unchanged
        # jobs_ended announces the plain job's cancel; the finished task's is no ending.
        assert len(callbacks) == 1
    assert finished.results == []  # and the Tasks backend ignores a plain job
