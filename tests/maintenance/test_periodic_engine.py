"""periodic_insert, periodic_last_slots, periodic_register, periodic_registrations."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobInsertParams,
    PeriodicInsertParams,
    PeriodicRegisterParams,
    PeriodicRegistration,
)
from tests.maintenance.conftest import register_client

SECOND = dt.timedelta(seconds=1)
MINUTE = dt.timedelta(minutes=1)


def insert_slot(engine: BaseEngine, name: str, slot: dt.datetime, now: dt.datetime) -> bool:
    params = PeriodicInsertParams(
        name=name, slot=slot, job=JobInsertParams(kind="tests.p"), now=now
    )
    job, inserted = engine.periodic_insert(params)  # type: ignore[attr-defined]
    assert (job is not None) == inserted
    return inserted


def reg(name: str, digest: str = "d") -> PeriodicRegistration:
    return PeriodicRegistration(name=name, definition={"name": name, "n": [1]}, digest=digest)


def test_a_slot_inserts_its_job_once(engine: BaseEngine, db_now: dt.datetime) -> None:
    slot = db_now.replace(microsecond=0)
    assert insert_slot(engine, "p", slot, db_now)
    assert not insert_slot(engine, "p", slot, db_now)
    assert not insert_slot(engine, "p", slot - SECOND, db_now)  # an older slot
    assert insert_slot(engine, "p", slot + SECOND, db_now)
    assert insert_slot(engine, "other", slot, db_now)
    assert engine.periodic_last_slots() == {  # type: ignore[attr-defined]
        "other": slot,
        "p": slot + SECOND,
    }


def test_the_inserted_job_is_available_with_the_given_fields(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job_params = JobInsertParams(kind="tests.p", queue="periodic", metadata={"periodic": "p"})
    job, inserted = engine.periodic_insert(  # type: ignore[attr-defined]
        PeriodicInsertParams(name="p", slot=db_now, job=job_params, now=db_now)
    )
    assert inserted and job is not None
    stored = engine.job_get(job.id)
    assert stored is not None
    assert (stored.kind, stored.queue, stored.state) == ("tests.p", "periodic", "available")
    assert stored.metadata == {"periodic": "p"}


def test_registrations_replace_a_clients_earlier_ones(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    a = register_client(engine, db_now)
    b = register_client(engine, db_now + SECOND)
    e: Any = engine
    e.periodic_register(PeriodicRegisterParams(a, [reg("x"), reg("y")], now=db_now))
    e.periodic_register(PeriodicRegisterParams(b, [reg("x", "d2")], now=db_now))
    e.periodic_register(PeriodicRegisterParams(a, [reg("y", "d3")], now=db_now))
    rows = e.periodic_registrations(now=db_now + SECOND)
    got = [(r.name, r.client_id, r.digest) for r in rows]
    assert got == [("x", b, "d2"), ("y", a, "d3")]
    assert rows[0].definition == {"name": "x", "n": [1]}
    assert rows[0].client_started_at == db_now + SECOND


def test_no_registration_for_an_expired_or_deleted_client(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    e: Any = engine
    short = register_client(engine, db_now, ttl=MINUTE)
    gone = register_client(engine, db_now)
    e.periodic_register(PeriodicRegisterParams(short, [reg("a")], now=db_now))
    e.periodic_register(PeriodicRegisterParams(gone, [reg("b")], now=db_now))
    later = db_now + 2 * MINUTE
    # Expired: its rows are not listed, and it records none (its call clears its rows).
    assert [r.name for r in e.periodic_registrations(now=later)] == ["b"]
    e.periodic_register(PeriodicRegisterParams(short, [reg("c")], now=later))
    assert [r.name for r in e.periodic_registrations(now=db_now)] == ["b"]
    # Deleted: the next registration by anyone removes its rows.
    engine.client_delete(gone)
    live = register_client(engine, db_now)
    e.periodic_register(PeriodicRegisterParams(live, [reg("d")], now=db_now))
    assert [(r.name, r.client_id) for r in e.periodic_registrations(now=db_now)] == [("d", live)]
