"""Control and insert notifications reach real worker processes (PostgreSQL).

Each worker here renews its lease every 30 s and polls every 30 s, so
anything that happens within a few seconds can only have come through
``LISTEN/NOTIFY``: these tests fail if the notification path is broken, where
the renewal would have hidden it.
"""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection

import django_hopper
from django_hopper.models import Client, Leader
from tests.support.runtime import get, insert, wait_for
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        os.environ.get("HOPPER_TEST_DATABASE", "sqlite") != "postgres",
        reason="notifications are a PostgreSQL feature; SQLite learns at renewal and poll",
    ),
]

#: Renewal and poll far beyond the test's deadlines: only a notification is fast enough.
SLOW_RENEWAL = {
    "CLIENT_TTL": 90.0,
    "HEARTBEAT_INTERVAL": 30.0,
    "POLL_INTERVAL": 30.0,
    "LEADER_TTL": 90.0,
    "MAINTENANCE_INTERVAL": 30.0,
}


def start_idle_worker(processes, queues: str = "default:2"):
    """Start a worker and wait until it has registered and run its first (empty) claim."""
    proc = processes.start("--queues", queues, overrides=SLOW_RENEWAL)
    wait_for(lambda: Client.objects.exists(), timeout=20)
    time.sleep(0.5)  # past its first claim, now asleep on the 30 s poll
    return proc


def test_an_insert_notification_wakes_an_idle_worker(tx_engine, processes):
    start_idle_worker(processes)
    job = jobs.add.enqueue(2, 2)
    wait_for(lambda: get(tx_engine, job.job).state == "completed", timeout=5)


def test_a_cancel_reaches_the_running_job_through_the_control_channel(tx_engine, processes):
    start_idle_worker(processes)
    job = jobs.rt_wait_cancel.enqueue(seconds=60)
    wait_for(lambda: get(tx_engine, job.job).state == "running", timeout=5)
    wait_for(lambda: Effect.objects.filter(job_id=job.id).exists(), timeout=5)
    django_hopper.cancel_job(job.id)
    row = wait_for(lambda: (r := get(tx_engine, job.job)).state == "canceled" and r, timeout=5)
    assert row.state == "canceled"


def test_a_resume_wakes_the_producer_of_a_paused_queue(tx_engine, processes):
    django_hopper.pause_queue("default")
    start_idle_worker(processes)
    job = jobs.add.enqueue(1, 2)
    time.sleep(1.0)
    assert get(tx_engine, job.job).state == "available"  # paused: not claimed
    django_hopper.resume_queue("default")
    wait_for(lambda: get(tx_engine, job.job).state == "completed", timeout=5)


def test_the_listener_reconnects_after_its_backend_is_terminated(tx_engine, processes):
    start_idle_worker(processes)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [connection.settings_dict["NAME"]],
        )
        assert cur.fetchone()[0] > 0
    time.sleep(2.0)  # the listener's reconnect backoff starts at 0.1 s
    job = insert(tx_engine, jobs.add, 3, 4)
    wait_for(lambda: get(tx_engine, job).state == "completed", timeout=8)
    assert get(tx_engine, job).output == 7
    assert all(p.poll() is None for p in processes.procs), processes.logs()


def test_a_stream_append_wakes_the_leaders_pump(tx_engine, processes):
    """Rounds are 30 s apart: a delivery within seconds came through the append's notice."""
    django_hopper.consume("woken", "orders.#", jobs.on_message, start="latest", save=True)
    start_idle_worker(processes)
    wait_for(lambda: Leader.objects.exists(), timeout=20)
    time.sleep(0.5)  # past its first round, now waiting 30 s for the next
    django_hopper.append("orders.created", {"id": 1})
    done = wait_for(
        lambda: [
            j for j in django_hopper.list_jobs(kinds=jobs.on_message.kind, states="completed")
        ],
        timeout=5,
    )
    assert done[0].output["topic"] == "orders.created"
