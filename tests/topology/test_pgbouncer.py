"""Hopper through a real PgBouncer (Debian's 1.18: no protocol-level prepared statements).

Each test starts worker processes whose "default" alias goes through a
bouncer the suite started, in transaction or in session pool mode, and
enqueues from this process. Workers here renew every 30 s and poll every
30 s unless the test says otherwise, so a job done within seconds was woken
by a notification.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.db import connection

from django_hopper.engine.base import BaseEngine
from django_hopper.models import Client
from tests.pgbouncer import Bouncer
from tests.support.runtime import ROOT, get, insert_many, wait_for
from tests.testapp import jobs
from tests.topology.conftest import BouncedProcesses, requires_postgres

pytestmark = [pytest.mark.processes, requires_postgres]

#: Renewal and poll far beyond the test's deadlines: only a notification is fast enough.
SLOW_POLL = {
    "CLIENT_TTL": 90.0,
    "HEARTBEAT_INTERVAL": 30.0,
    "POLL_INTERVAL": 30.0,
    "LEADER_TTL": 90.0,
    "MAINTENANCE_INTERVAL": 30.0,
}


@pytest.fixture
def bounced(tx_engine: BaseEngine, tmp_path, bouncers: dict[str, Bouncer]):
    """Start worker processes through a bouncer: ``bounced(mode).start(...)``."""
    made: list[BouncedProcesses] = []

    def make(mode: str) -> BouncedProcesses:
        procs = BouncedProcesses(
            str(connection.settings_dict["NAME"]), tmp_path / f"{mode}-{len(made)}", bouncers[mode]
        )
        procs.tmp.mkdir()
        made.append(procs)
        return procs

    yield make
    for procs in made:
        procs.kill_all()


def run_through(tx_engine: BaseEngine, procs: BouncedProcesses, count: int, timeout: float) -> None:
    """Enqueue ``count`` jobs once a worker registered; wait until all completed."""
    wait_for(lambda: Client.objects.exists(), timeout=90)
    time.sleep(0.5)  # past the first (empty) claim
    rows = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(count)])
    for row in rows:
        wait_for(lambda row=row: get(tx_engine, row).state == "completed", timeout=timeout)
    assert sorted(get(tx_engine, r).output for r in rows) == [i + 1 for i in range(count)]
    assert all(p.poll() is None for p in procs.procs), procs.logs()


def test_transaction_pooler__workers_listen_through_the_direct_connection(tx_engine, bounced):
    procs = bounced("transaction")
    procs.start("--queues", "default:4", "-v", "2", overrides=SLOW_POLL)
    procs.start("--queues", "default:4", "-v", "2", overrides=SLOW_POLL)

    run_through(tx_engine, procs, 40, timeout=10)

    logs = procs.logs()
    assert "through a transaction pooler, no prepared statements, LISTEN through 'direct'" in logs


def test_transaction_pooler__without_a_direct_connection_workers_poll(tx_engine, bounced):
    procs = bounced("transaction")
    procs.start("--queues", "default:4", overrides={"DIRECT_DATABASES": {}, "POLL_INTERVAL": 0.2})

    run_through(tx_engine, procs, 20, timeout=10)

    assert "no prepared statements, polling every 0.2s" in procs.logs()


def test_session_pooler__prepared_statements_and_listen_through_the_bouncer(tx_engine, bounced):
    procs = bounced("session")
    procs.start("--queues", "default:4", "-v", "2", overrides={**SLOW_POLL, "DIRECT_DATABASES": {}})

    run_through(tx_engine, procs, 20, timeout=10)

    assert "through a session pooler, prepared statements, LISTEN" in procs.logs()


def test_transaction_pooler__a_leader_is_elected_and_maintains(tx_engine, bounced):
    procs = bounced("transaction")
    procs.start("--queues", "default:2", "-v", "2")
    procs.start("--queues", "default:2", "-v", "2")

    leader = wait_for(lambda: tx_engine.leader_get(), timeout=90)

    assert leader in set(Client.objects.values_list("id", flat=True))
    assert "LISTEN through 'direct'" in procs.logs()
    assert all(p.poll() is None for p in procs.procs), procs.logs()


def test_check_database__warns_about_an_undeclared_proxy(bounced):
    procs = bounced("transaction")
    env = procs.env({"POOLERS": {}, "DIRECT_DATABASES": {}})
    out = subprocess.run(
        [sys.executable, "-m", "django", "check", "--database", "default"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "hopper.W202" in out.stdout + out.stderr, out.stdout + out.stderr


def test_check_database__is_quiet_about_a_declared_pooler(bounced):
    procs = bounced("transaction")
    out = subprocess.run(
        [sys.executable, "-m", "django", "check", "--database", "default"],
        cwd=ROOT,
        env=procs.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "hopper.W202" not in out.stdout + out.stderr
    assert out.returncode == 0, out.stdout + out.stderr
