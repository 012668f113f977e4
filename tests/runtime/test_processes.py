"""Real worker processes on the test database: crashes, terminated backends, leader
failover, signals, burst and the supervisor."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict

import pytest
from django.db import connection

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from django_hopper.maintenance import Rescuer
from django_hopper.models import Client
from tests.support.runtime import FINAL, Processes, get, insert, insert_many, wait_for
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.processes

POSTGRES = os.environ.get("HOPPER_TEST_DATABASE", "sqlite") == "postgres"


def all_jobs(engine: BaseEngine) -> list:
    return engine.job_list(JobListParams(limit=10_000))


def assert_each_ran_once_per_claim(engine: BaseEngine, expected: int) -> None:
    """Every job completed; no claim ran twice; every failed claim has exactly one error.

    A job's effect is written in its own transaction, so a worker killed
    between that commit and the finalize leaves an effect whose claim the
    rescue ends: the job then has several effects, each at a different fence,
    and one error entry per attempt that did not complete.
    """
    rows = all_jobs(engine)
    assert len(rows) == expected
    states = defaultdict(int)
    for row in rows:
        states[row.state] += 1
    assert states == {"completed": expected}, dict(states)
    effects = defaultdict(list)
    for job_id, fence in Effect.objects.values_list("job_id", "fence"):
        effects[job_id].append(fence)
    for row in rows:
        fences = effects[row.id]
        assert len(fences) == len(set(fences)), f"a claim of {row.id} ran twice: {fences}"
        assert row.fence in fences, f"{row.id} completed at fence {row.fence} without its effect"
        assert len(fences) <= row.attempt
        assert len(row.errors) == row.attempt - 1, (row.attempt, [e.error for e in row.errors])


def wait_all_final(engine: BaseEngine, procs: Processes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(r.state in FINAL for r in all_jobs(engine)):
            return
        time.sleep(0.2)
    left = [(r.id, r.state) for r in all_jobs(engine) if r.state not in FINAL]
    pytest.fail(f"{len(left)} jobs not finished: {left[:5]}\n{procs.logs()}")


def kill_a_busy_worker(
    engine: BaseEngine, processes: Processes, workers: list, rng: random.Random, conc: str
) -> bool:
    """SIGKILL a worker process that holds running jobs now, and start a replacement.

    Returns False if no worker held a job (all work may be done).
    """
    running = engine.job_list(JobListParams(states=("running",), limit=1000))
    owners = {r.attempted_by for r in running}
    pids = {c.id: int(c.info.get("pid", 0)) for c in engine.client_list()}
    busy = [i for i, w in enumerate(workers) if w.pid in {pids.get(o) for o in owners}]
    if not busy:
        return False
    victim = rng.choice(busy)
    workers[victim].send_signal(signal.SIGKILL)
    workers[victim].wait(5)
    workers[victim] = processes.start("--queues", conc)
    return True


def test_workers_killed_mid_job_lose_nothing_and_run_no_claim_twice(tx_engine, processes):
    rng = random.Random(1234)
    insert_many(
        tx_engine, jobs.rt_effect, [((), {"seconds": rng.uniform(0.1, 0.4)}) for _ in range(80)]
    )
    workers = [processes.start("--queues", "default:4") for _ in range(3)]
    kills = 0
    deadline = time.monotonic() + 30
    while kills < 5 and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.1, 0.4))
        kills += kill_a_busy_worker(tx_engine, processes, workers, rng, "default:4")
    assert kills >= 3, processes.logs()
    wait_all_final(tx_engine, processes, timeout=90)
    assert_each_ran_once_per_claim(tx_engine, 80)
    # Claims really were interrupted (otherwise the test proves nothing).
    assert any(r.attempt > 1 for r in all_jobs(tx_engine))


@pytest.mark.slow
def test_soak_many_kills(tx_engine, processes):
    rng = random.Random(99)
    insert_many(
        tx_engine, jobs.rt_effect, [((), {"seconds": rng.uniform(0.0, 0.3)}) for _ in range(400)]
    )
    workers = [processes.start("--queues", "default:6") for _ in range(4)]
    kills = 0
    deadline = time.monotonic() + 120
    while kills < 30 and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.05, 0.5))
        kills += kill_a_busy_worker(tx_engine, processes, workers, rng, "default:6")
    wait_all_final(tx_engine, processes, timeout=300)
    assert_each_ran_once_per_claim(tx_engine, 400)


@pytest.mark.skipif(not POSTGRES, reason="terminating backends is a PostgreSQL operation")
def test_workers_reconnect_after_their_backends_are_terminated(tx_engine, processes):
    insert_many(tx_engine, jobs.rt_effect, [((), {"seconds": 0.05}) for _ in range(60)])
    processes.start("--queues", "default:4", overrides={"CLIENT_TTL": 5.0})
    processes.start("--queues", "default:4", overrides={"CLIENT_TTL": 5.0})
    wait_for(lambda: Client.objects.count() == 2, timeout=30)  # both connected
    name = connection.settings_dict["NAME"]
    terminated = 0
    for _ in range(6):
        time.sleep(0.4)
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )
            terminated += cur.fetchone()[0]
    assert terminated > 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = all_jobs(tx_engine)
        if all(r.state == "completed" for r in rows):
            break
        Rescuer(tx_engine).run_once()
        time.sleep(0.2)
    rows = all_jobs(tx_engine)
    assert len(rows) == 60
    assert {r.state for r in rows} == {"completed"}, processes.logs()
    effects = defaultdict(list)
    for job_id, fence in Effect.objects.values_list("job_id", "fence"):
        effects[job_id].append(fence)
    for row in rows:
        assert len(effects[row.id]) == len(set(effects[row.id]))
        assert row.fence in effects[row.id]
    assert all(p.poll() is None for p in processes.procs), processes.logs()


def _leader_pid(engine: BaseEngine) -> int | None:
    leader = engine.leader_get()
    if leader is None:
        return None
    for client in engine.client_list():
        if client.id == leader:
            return int(client.info["pid"])
    return None


def test_one_leader_among_workers_and_another_takes_over_when_it_is_killed(tx_engine, processes):
    procs = [processes.start("--queues", "default:1") for _ in range(3)]
    pids = {p.pid for p in procs}
    wait_for(lambda: Client.objects.count() == 3, timeout=20)
    leader_pid = wait_for(lambda: _leader_pid(tx_engine), timeout=10)
    assert leader_pid in pids
    old_leader = tx_engine.leader_get()
    for _ in range(5):  # stays put: exactly one leader, the same one
        time.sleep(0.1)
        assert tx_engine.leader_get() == old_leader
    os.kill(leader_pid, signal.SIGKILL)
    killed = time.monotonic()
    new = wait_for(
        lambda: (lid := tx_engine.leader_get()) not in (None, old_leader) and lid, timeout=10
    )
    assert time.monotonic() - killed < 1.5 + 2.0  # LEADER_TTL plus a maintenance round
    assert _leader_pid(tx_engine) in pids - {leader_pid}
    assert new != old_leader


def test_sigterm_lets_running_jobs_finish_and_exits_zero(tx_engine, processes):
    held = [insert(tx_engine, jobs.rt_hold, 1.0) for _ in range(2)]
    proc = processes.start("--queues", "default:2")
    wait_for(lambda: all(get(tx_engine, j).state == "running" for j in held), timeout=20)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, processes.logs()
    assert [get(tx_engine, j).state for j in held] == ["completed", "completed"]
    assert not Client.objects.exists()


def test_sigterm_past_the_shutdown_timeout_leaves_the_job_to_the_rescue(tx_engine, processes):
    held = insert(tx_engine, jobs.rt_hold, 30)
    proc = processes.start("--queues", "default:1", "--shutdown-timeout", "0.3")
    wait_for(lambda: get(tx_engine, held).state == "running", timeout=20)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, processes.logs()
    assert get(tx_engine, held).state == "running"
    assert Rescuer(tx_engine).run_once() == 1
    assert get(tx_engine, held).state == "retryable"


def test_burst_command_runs_everything_and_exits(tx_engine, processes):
    added = insert_many(tx_engine, jobs.add, [((i, 0), {}) for i in range(30)])
    proc = processes.start("--burst", "--queues", "default:5")
    assert proc.wait(60) == 0, processes.logs()
    assert [get(tx_engine, j).output for j in added] == list(range(30))


def test_two_burst_workers_on_one_database_finish_every_job_once(tx_engine, processes):
    # On SQLite each process orders its own writers with its write lock; the two
    # processes meet at SQLite's lock, through the busy timeout.
    added = insert_many(tx_engine, jobs.add, [((i, 1), {}) for i in range(300)])
    workers = [processes.start("--burst", "--queues", "default:5") for _ in range(2)]
    assert [w.wait(120) for w in workers] == [0, 0], processes.logs()
    rows = [get(tx_engine, j) for j in added]
    assert [r.output for r in rows] == [i + 1 for i in range(300)]
    assert {(r.state, r.attempt) for r in rows} == {("completed", 1)}


def test_supervisor_runs_several_processes(tx_engine, processes):
    insert_many(tx_engine, jobs.rt_effect, [((), {"seconds": 0.2}) for _ in range(40)])
    proc = processes.start("--burst", "--processes", "2", "--queues", "default:4")
    assert proc.wait(60) == 0, processes.logs()
    rows = all_jobs(tx_engine)
    assert {r.state for r in rows} == {"completed"}
    assert len({r.attempted_by for r in rows}) == 2  # two children, two clients


def test_hopper_maintain_rescues_jobs_of_a_killed_worker(tx_engine, processes):
    held = insert(tx_engine, jobs.rt_hold, 30)
    worker = processes.start("--queues", "default:1", "--no-maintenance")
    wait_for(lambda: get(tx_engine, held).state == "running", timeout=20)
    worker.send_signal(signal.SIGKILL)
    worker.wait(5)
    processes.start(command="hopper_maintain")
    wait_for(lambda: get(tx_engine, held).state != "running", timeout=15)
    row = get(tx_engine, held)
    assert row.errors[-1].rescue == "client_expired"
