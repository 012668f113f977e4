"""The worker's console lines for queue controls and a lost database."""

from __future__ import annotations

import logging

import pytest

from django_hopper.types import ControlMessage
from django_hopper.worker.control import log_control_changes
from django_hopper.worker.db import ConnectionWatch


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("django_hopper")]


def test_control_lines__each_pause_resume_and_limit_change_is_said_once(caplog):
    with caplog.at_level(logging.INFO, logger="django_hopper"):
        log_control_changes({"a"}, {"b"}, set(), {"c"})
        log_control_changes({"b"}, {"b"}, {"c"}, {"c"})  # nothing changed: nothing said
        log_control_changes(set(), set(), {"c"}, set())
    assert messages(caplog) == [
        "queue b paused: nothing more is claimed from it",
        "queue a resumed",
        "queue c limits set: claims follow its concurrency and rate limits",
        "queue c limits removed",
    ]


def test_connection_watch__says_lost_once_and_regained_once(caplog):
    watch = ConnectionWatch("renewing the client lease")
    with caplog.at_level(logging.INFO, logger="django_hopper"):
        watch.ok()  # nothing was lost
        for _ in range(5):
            watch.failed(ConnectionError("server closed the connection"))
        watch.ok()
        watch.ok()
    said = messages(caplog)
    assert len(said) == 2
    assert said[0] == (
        "lost the database connection (renewing the client lease): server closed the connection"
    )
    assert said[1].startswith("database connection regained (renewing the client lease) after ")
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_connection_watch__keeps_each_retry_traceback_at_debug(caplog):
    watch = ConnectionWatch("claiming from queue default")
    with caplog.at_level(logging.DEBUG, logger="django_hopper"):
        for _ in range(3):
            watch.failed(ConnectionError("gone"))
    debug = [r for r in caplog.records if r.levelname == "DEBUG"]
    assert len(debug) == 3
    assert all(r.exc_info is not None for r in debug)


def test_control_lines__a_worker_logs_a_pause_it_learns_from_a_renewal(make_worker, caplog):
    worker = make_worker(queues={"default": 1})
    with caplog.at_level(logging.INFO, logger="django_hopper"):
        worker.control.apply([], ["default"], [])
        worker.control.apply([], ["default"], [])
        worker.control.apply([], [], [])
    assert messages(caplog) == [
        "queue default paused: nothing more is claimed from it",
        "queue default resumed",
    ]


def test_control_lines__a_notification_and_the_renewal_after_it_say_it_once(make_worker, caplog):
    worker = make_worker(queues={"default": 1})
    with caplog.at_level(logging.INFO, logger="django_hopper"):
        worker.control.on_message(ControlMessage.pause("default").payload())
        worker.control.apply([], ["default"], [])  # the renewal repeats it: nothing more
        worker.control.on_message(ControlMessage.limits("default", True).payload())
        worker.control.apply([], ["default"], ["default"])
        worker.control.on_message(ControlMessage.limits("default", False).payload())
        worker.control.on_message(ControlMessage.resume("default").payload())
    assert messages(caplog) == [
        "queue default paused: nothing more is claimed from it",
        "queue default limits set: claims follow its concurrency and rate limits",
        "queue default limits removed",
        "queue default resumed",
    ]


def test_heartbeat__a_lost_database_is_one_line_and_its_return_another(
    make_worker, caplog, monkeypatch
):
    from django.db import OperationalError

    worker = make_worker(queues={"default": 1}, heartbeat_interval=60.0)
    control = worker.control
    renew = worker.engine.client_renew
    calls = 0

    def flaky(params):
        nonlocal calls
        calls += 1
        control.renew.set()  # retry at once rather than after the backoff
        if calls <= 3:
            raise OperationalError("server closed the connection unexpectedly")
        control.stopping_hard.set()  # the renewal that works is the last one
        return renew(params)

    monkeypatch.setattr(worker.engine, "client_renew", flaky)
    with caplog.at_level(logging.INFO, logger="django_hopper"):
        worker.heartbeat.run()
    said = messages(caplog)
    assert said[0] == (
        "lost the database connection (renewing the client lease): "
        "server closed the connection unexpectedly"
    )
    assert said[1].startswith("database connection regained (renewing the client lease) after ")
    assert len(said) == 2
