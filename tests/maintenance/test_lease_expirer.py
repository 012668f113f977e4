"""The leader's lease-expiry service: ends due job leases as the leader's client."""

from __future__ import annotations

import datetime as dt

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimByIDParams,
    JobInsertOpts,
    JobInsertParams,
)
from django_hopper.maintenance import LeaseExpirer, default_services

MINUTE = dt.timedelta(minutes=1)


def test_lease_expirer__retries_a_due_leased_job_as_the_leader(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    leader = engine.client_register(
        ClientRegisterParams(hostname="leader", ttl=dt.timedelta(hours=1), now=db_now)
    )
    (res,) = engine.job_insert_many(
        [JobInsertParams(kind="tests.job", queue="lx")], JobInsertOpts(now=db_now)
    )
    engine.job_claim_by_id(JobClaimByIDParams(id=res.job.id, fence=0, ttl=MINUTE, now=db_now))
    service = LeaseExpirer(engine, lambda: leader)

    assert service.run_once(now=db_now + MINUTE - dt.timedelta(seconds=1)) == 0
    assert service.run_once(now=db_now + MINUTE) == 1
    job = engine.job_get(res.job.id)
    assert job is not None and job.state == "retryable"
    assert job.errors[-1].rescue == "lease_expired"


def test_lease_expirer__without_a_leader_client_does_nothing(engine: BaseEngine) -> None:
    assert LeaseExpirer(engine, lambda: None).run_once() == 0


def test_default_services__include_lease_expiry_only_with_a_client(engine: BaseEngine) -> None:
    assert "expire_leases" in [s.name for s in default_services(engine, lambda: 1)]
    assert "expire_leases" not in [s.name for s in default_services(engine)]
