"""Workers ride out a PostgreSQL restart and a read-only period (real processes).

The shared server is never restarted: a restart is what its clients see of
it, every backend terminated (``pg_terminate_backend``); a failover's
read-only period is ``default_transaction_read_only`` on the test database,
which only new sessions take, so it is set and then every backend is
terminated, and lifted the same way. Nothing is lost or finalized twice:
every job completes once, its recorded effect is its completing attempt's,
and the workers say in their log that they failed and resumed. The recovery
time is printed (``-s``); the benchmark, not a test, judges speed.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection, connections

from django_hopper.engine import get_engine
from django_hopper.engine.base import BaseEngine
from django_hopper.models import Client
from tests.support.runtime import FINAL, get, insert_many, wait_for
from tests.testapp import jobs
from tests.testapp.models import Effect
from tests.topology.conftest import requires_postgres

pytestmark = [pytest.mark.processes, requires_postgres]


def admin():
    """This test's own session: "direct" when "default" goes through a bouncer.

    A bouncer's server connections opened during the read-only period stay
    read-only until terminated, and the test must write meanwhile.
    """
    return connections["direct"] if "direct" in connections.settings else connection


def admin_engine() -> BaseEngine:
    return get_engine(admin().alias)


def terminate_backends() -> int:
    """Terminate every backend of the test database but this test's own session."""
    with admin().cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            [connection.settings_dict["NAME"]],
        )
        return int(cur.fetchone()[0])


def set_read_only(on: bool) -> None:
    """Make new sessions of the test database read-only (or writable again)."""
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with admin().cursor() as cur:
        cur.execute(
            f"ALTER DATABASE {name} SET default_transaction_read_only = {'on' if on else 'off'}"
        )


@pytest.fixture
def writable_afterwards(tx_engine: BaseEngine):
    """Whatever happens, leave the test database writable for new sessions."""
    yield
    set_read_only(False)


def start_workers(processes, count: int = 2) -> None:
    for _ in range(count):
        processes.start("--queues", "default:4", "-v", "2")
    wait_for(lambda: Client.objects.count() >= count, timeout=90)


def assert_each_completed_once(engine: BaseEngine, rows) -> None:
    """Every job completed, and the effect of its completing attempt was recorded once."""
    finals = [get(engine, r) for r in rows]
    assert [f.state for f in finals] == ["completed"] * len(rows)
    for final in finals:
        effects = list(Effect.objects.filter(job_id=final.id).values_list("fence", flat=True))
        assert effects.count(final.fence) == 1, (final.id, final.fence, effects)
        assert final.output == final.fence


def full_logs(processes) -> str:
    """Every worker's whole output (``processes.logs()`` keeps only each tail)."""
    return "\n".join(p.read_text(errors="replace") for p in processes.tmp.glob("*.log"))


def test_failover__workers_ride_out_every_backend_terminated(tx_engine, processes, monkeypatch):
    monkeypatch.setenv("HOPPER_TEST_LOG_LEVEL", "INFO")  # the "regained" line is INFO
    start_workers(processes)
    rows = insert_many(tx_engine, jobs.rt_effect, [((), {"seconds": 0.02}) for _ in range(120)])
    wait_for(lambda: Effect.objects.count() >= 20, timeout=20)

    assert terminate_backends() > 0
    cut = time.monotonic()
    done_before = Effect.objects.count()
    wait_for(lambda: Effect.objects.count() > done_before, timeout=20)
    first = time.monotonic() - cut
    wait_for(lambda: all(get(tx_engine, r).state in FINAL for r in rows), timeout=60)
    print(f"\nrecovery after terminating every backend: first job {first:.2f}s")

    assert_each_completed_once(tx_engine, rows)
    wait_for(lambda: tx_engine.leader_get() is not None, timeout=20)
    assert all(p.poll() is None for p in processes.procs), processes.logs()
    logs = full_logs(processes)
    assert "database connection regained" in logs or "listening again" in logs, processes.logs()


def test_failover__workers_resume_after_a_read_only_period(
    tx_engine, processes, writable_afterwards, monkeypatch
):
    monkeypatch.setenv("HOPPER_TEST_LOG_LEVEL", "INFO")  # the "regained" line is INFO
    start_workers(processes)
    set_read_only(True)
    terminate_backends()
    # Written by this session, which began writable: waiting while nobody can claim.
    rows = insert_many(admin_engine(), jobs.rt_effect, [((), {}) for _ in range(60)])
    time.sleep(2.0)  # the read-only period: the workers' writes are refused
    assert all(get(admin_engine(), r).state == "available" for r in rows)

    set_read_only(False)
    terminate_backends()
    lifted = time.monotonic()
    wait_for(lambda: Effect.objects.exists(), timeout=20)
    first = time.monotonic() - lifted
    wait_for(lambda: all(get(tx_engine, r).state in FINAL for r in rows), timeout=60)
    print(f"\nrecovery after a read-only period: first job {first:.2f}s")

    assert_each_completed_once(tx_engine, rows)
    wait_for(lambda: tx_engine.leader_get() is not None, timeout=20)
    logs = full_logs(processes)
    assert "read-only transaction" in logs
    assert "database connection regained" in logs or "registered again" in logs, processes.logs()
    assert all(p.poll() is None for p in processes.procs), processes.logs()


def test_failover__a_worker_started_during_a_read_only_period_waits_for_the_primary(
    tx_engine, processes, writable_afterwards
):
    set_read_only(True)
    terminate_backends()  # a bouncer's server connections too
    processes.start("--queues", "default:2", "-v", "2")
    wait_for(lambda: "unavailable at start-up" in processes.logs(), timeout=90)
    assert "read-only transaction" in processes.logs()
    assert not Client.objects.using(admin().alias).exists()
    assert processes.procs[0].poll() is None, processes.logs()

    set_read_only(False)
    terminate_backends()
    row = insert_many(tx_engine, jobs.add, [((1, 2), {})])[0]

    wait_for(lambda: get(tx_engine, row).state == "completed", timeout=20)
