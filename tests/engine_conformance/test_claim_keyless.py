"""The keyless claim: a queue without keyed candidates is claimed by a smaller
statement, which must claim exactly what the full one would, however keyed jobs
arrive (docs/queue-controls.md, "Ordering keys")."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection, transaction

from django_hopper.engine import base as engine_base
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobInsertParams
from django_hopper.ids import new_ids
from django_hopper.types import JobRow
from tests.engine_conformance.support import (
    MINUTE,
    claim,
    finalize,
    get,
    insert,
    insert_many,
    register,
    result,
)
from tests.engine_conformance.test_concurrency import run_threads


class Spy:
    """Count the engine's keyless claims and those that found keyed candidates."""

    def __init__(self, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keyless = 0
        self.refused = 0
        hook = engine._job_claim_keyless

        def spy(params: Any) -> Any:
            out = hook(params)
            self.keyless += 1
            self.refused += out is None
            return out

        monkeypatch.setattr(engine, "_job_claim_keyless", spy)


@pytest.fixture
def always_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Try the keyless statement on every claim (no remembered keyed queues)."""
    monkeypatch.setattr(engine_base, "KEYED_RECHECK", 0.0)


def test_claim__a_queue_without_keys_is_claimed_by_the_keyless_statement(
    engine: BaseEngine,
    db_now: dt.datetime,
    client_id: int,
    monkeypatch: pytest.MonkeyPatch,
    always_probe: None,
) -> None:
    spy = Spy(engine, monkeypatch)
    a, b = sorted(new_ids(2))
    insert_many(
        engine,
        [
            JobInsertParams(kind="tests.k", queue="keyless", id=a),
            JobInsertParams(kind="tests.k", queue="keyless", id=b, priority=5),
        ],
        db_now,
    )

    claimed = claim(engine, client_id, db_now, queue="keyless", limit=10)

    assert [j.id for j in claimed] == [b, a]
    assert (spy.keyless, spy.refused) == (1, 0)


def test_claim__a_keyed_job_enqueued_into_a_queue_that_had_none_is_claimed_in_order(
    engine: BaseEngine,
    db_now: dt.datetime,
    client_id: int,
    monkeypatch: pytest.MonkeyPatch,
    always_probe: None,
) -> None:
    spy = Spy(engine, monkeypatch)
    queue = "turns-keyed"
    low = insert(engine, db_now, queue=queue, priority=-5)
    assert [j.id for j in claim(engine, client_id, db_now, queue=queue)] == [low.id]
    assert (spy.keyless, spy.refused) == (1, 0)

    plain = insert(engine, db_now, queue=queue)
    k1, k2, k3 = (
        r.job
        for r in insert_many(
            engine,
            [JobInsertParams(kind="tests.k", queue=queue, ordering_key="a", priority=5)] * 3,
            db_now,
        )
    )

    # The keyed head outranks the plain job; the key's later jobs wait for it.
    got = claim(engine, client_id, db_now, queue=queue, limit=10)
    assert [j.id for j in got] == [k1.id, plain.id]
    assert get(engine, k2).state == get(engine, k3).state == "available"
    assert (spy.keyless, spy.refused) == (2, 1)
    assert claim(engine, client_id, db_now, queue=queue, limit=10) == []

    for head, nxt in ((k1, k2), (k2, k3)):
        assert finalize(engine, db_now, result(get(engine, head), "completed"))
        assert [j.id for j in claim(engine, client_id, db_now, queue=queue)] == [nxt.id]


def test_claim__a_scheduled_keyed_job_sends_the_claim_to_the_full_statement(
    engine: BaseEngine,
    db_now: dt.datetime,
    client_id: int,
    monkeypatch: pytest.MonkeyPatch,
    always_probe: None,
) -> None:
    """A keyed job not yet due is a candidate once its time comes; until then the
    full statement claims what the keyless one would."""
    spy = Spy(engine, monkeypatch)
    queue = "keyed-later"
    keyed = insert(engine, db_now, queue=queue, ordering_key="a", scheduled_at=db_now + MINUTE)
    plain = insert(engine, db_now, queue=queue)

    assert [j.id for j in claim(engine, client_id, db_now, queue=queue, limit=10)] == [plain.id]
    assert (spy.keyless, spy.refused) == (1, 1)
    got = claim(engine, client_id, db_now + 2 * MINUTE, queue=queue, limit=10)
    assert [j.id for j in got] == [keyed.id]


def test_claim__a_paused_queue_with_keys_yields_nothing_on_either_statement(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, always_probe: None
) -> None:
    queue = "keyed-paused"
    insert(engine, db_now, queue=queue, ordering_key="a")
    insert(engine, db_now, queue=queue)
    engine.queue_pause(queue)

    assert claim(engine, client_id, db_now, queue=queue, limit=10) == []


# -- races: keyed inserts committing while claims run --------------------------------------


@pytest.mark.usefixtures("always_probe")
def test_claim__a_keyed_insert_committed_after_a_keyless_claim_is_claimed_in_order(
    tx_engine: BaseEngine,
) -> None:
    """A keyless claim whose snapshot misses a keyed insert leaves it alone; the
    next claim sees the key and claims its head alone."""
    if tx_engine.features.single_writer:
        pytest.skip("one writer: no claim runs between an insert and its commit")
    now = tx_engine.now()
    queue = "keyed-race"
    client_id = register(tx_engine, now)
    plain = insert(tx_engine, now, queue=queue)
    inserted = threading.Event()
    release = threading.Event()
    keyed: list[JobRow] = []

    def insert_keyed() -> None:
        try:
            with transaction.atomic():
                keyed.extend(
                    r.job
                    for r in insert_many(
                        tx_engine,
                        [JobInsertParams(kind="tests.k", queue=queue, ordering_key="a")] * 2,
                        now,
                    )
                )
                inserted.set()
                release.wait(10)
        finally:
            inserted.set()
            connection.close()

    thread = threading.Thread(target=insert_keyed, daemon=True)
    thread.start()
    assert inserted.wait(10)
    try:
        first = claim(tx_engine, client_id, now, queue=queue, limit=10)
    finally:
        release.set()
        thread.join(10)

    assert [j.id for j in first] == [plain.id]
    k1, k2 = keyed
    assert [j.id for j in claim(tx_engine, client_id, now, queue=queue, limit=10)] == [k1.id]
    assert get(tx_engine, k2).state == "available"


@pytest.mark.usefixtures("always_probe")
def test_claim__keyed_jobs_inserted_while_claims_run_run_one_at_a_time_in_id_order(
    tx_engine: BaseEngine,
) -> None:
    """Two threads insert keyed and plain jobs one per transaction while two
    claim and complete them: every job runs once, and each key's jobs run one
    at a time in the order of their IDs."""
    now = tx_engine.now()
    queue = "keyed-churn"
    clients = [register(tx_engine, now) for _ in range(2)]
    per_thread = 20
    done = threading.Event()
    inserted_by: dict[int, list[Any]] = {0: [], 1: []}
    lock = threading.Lock()
    running: dict[str, Any] = {}
    overlaps: list[str] = []
    ran: list[tuple[str | None, Any]] = []

    def inserter(i: int) -> None:
        for n in range(per_thread):
            key = f"k{i}-{n % 3}" if n % 4 else None
            (r,) = insert_many(
                tx_engine, [JobInsertParams(kind="tests.k", queue=queue, ordering_key=key)], now
            )
            inserted_by[i].append(r.job.id)

    def claimer(i: int) -> None:
        idle_after_done = 0
        while idle_after_done < 2:
            finished = done.is_set()
            jobs = claim(tx_engine, clients[i], now, queue=queue, limit=3)
            if not jobs:
                idle_after_done += finished
                continue
            with lock:
                for j in jobs:
                    ran.append((j.ordering_key, j.id))
                    if j.ordering_key is not None:
                        if j.ordering_key in running:
                            overlaps.append(j.ordering_key)
                        running[j.ordering_key] = j.id
            # The jobs "run" here. Each is forgotten before its finalize commits:
            # until then no claim may take its key's next job.
            with lock:
                for j in jobs:
                    if j.ordering_key is not None:
                        running.pop(j.ordering_key, None)
            assert finalize(tx_engine, now, *(result(j, "completed") for j in jobs))

    inserters_done = threading.Barrier(2)

    def target(i: int) -> None:
        if i >= 2:
            claimer(i - 2)
            return
        try:
            inserter(i)
        finally:
            if inserters_done.wait(20) == 0:
                done.set()

    run_threads(4, target, timeout=60)

    inserted = inserted_by[0] + inserted_by[1]
    assert sorted(i for _k, i in ran) == sorted(inserted), "every job ran exactly once"
    assert not overlaps, f"two jobs of a key ran at once: {overlaps}"
    by_key: dict[str, list[Any]] = {}
    for key, job_id in ran:
        if key is not None:
            by_key.setdefault(key, []).append(job_id)
    for key, ids in by_key.items():
        assert ids == sorted(ids), f"key {key} ran out of order"
