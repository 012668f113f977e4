"""A retention pass on a fresh database never loses a job finalized today."""

from __future__ import annotations

import datetime as dt

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalizeParams,
    JobInsertOpts,
    JobInsertParams,
)
from django_hopper.maintenance import HistoryPruner


def test_retention__first_pass_keeps_jobs_finalized_today(tx_engine: BaseEngine) -> None:
    engine = tx_engine
    engine.job_insert_many([JobInsertParams(kind="tests.fresh") for _ in range(3)], JobInsertOpts())
    client = engine.client_register(ClientRegisterParams(hostname="t", ttl=dt.timedelta(minutes=1)))
    jobs = engine.job_claim(JobClaimParams(queue="default", client_id=client, limit=3)).jobs
    engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[
                JobFinalize(id=j.id, attempted_by=client, fence=j.fence, state="completed")
                for j in jobs
            ]
        )
    )
    HistoryPruner(engine).run_once()
    for j in jobs:
        row = engine.job_get(j.id)
        assert row is not None and row.state == "completed"
