"""Small helpers shared by the conformance modules: drive jobs through engine methods.

Every helper takes ``now`` and passes it to the engine, so tests never sleep and
never depend on the clock moving.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from typing import Any

from django.db import connection

from django_hopper.engine.base import BaseEngine, Listener
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalized,
    JobFinalizeParams,
    JobInsertOpts,
    JobInsertParams,
    JobInsertResult,
    JobListParams,
)
from django_hopper.types import LIVE_STATES, JobRow, Notification

SECOND = dt.timedelta(seconds=1)
MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)


def insert_many(
    engine: BaseEngine,
    params: Iterable[JobInsertParams],
    now: dt.datetime,
    **opts: Any,
) -> list[JobInsertResult]:
    return engine.job_insert_many(list(params), JobInsertOpts(now=now, **opts))


def insert(engine: BaseEngine, now: dt.datetime, kind: str = "tests.job", **fields: Any) -> JobRow:
    """Insert one job and return it (asserting it was not a duplicate)."""
    (result,) = insert_many(engine, [JobInsertParams(kind=kind, **fields)], now)
    assert not result.duplicate
    return result.job


def register(engine: BaseEngine, now: dt.datetime, ttl: dt.timedelta = HOUR) -> int:
    return engine.client_register(ClientRegisterParams(hostname="test-host", ttl=ttl, now=now))


def claim(
    engine: BaseEngine, client_id: int, now: dt.datetime, queue: str = "default", limit: int = 10
) -> list[JobRow]:
    return engine.job_claim(
        JobClaimParams(queue=queue, client_id=client_id, limit=limit, now=now)
    ).jobs


def claim_one(
    engine: BaseEngine, client_id: int, now: dt.datetime, queue: str = "default"
) -> JobRow:
    jobs = claim(engine, client_id, now, queue=queue, limit=1)
    assert len(jobs) == 1, f"expected one job claimed, got {jobs!r}"
    return jobs[0]


def running(
    engine: BaseEngine, client_id: int, now: dt.datetime, kind: str = "tests.job", **fields: Any
) -> JobRow:
    """Insert a job in its own queue and claim it: the job as claimed."""
    queue = fields.pop("queue", f"q-{kind}-{time.monotonic_ns()}")
    job = insert(engine, now, kind=kind, queue=queue, **fields)
    claimed = claim_one(engine, client_id, now, queue=queue)
    assert claimed.id == job.id
    return claimed


def result(job: JobRow, state: str, **fields: Any) -> JobFinalize:
    """A result of the attempt that claimed ``job`` (its client and fence)."""
    return JobFinalize(
        id=job.id, attempted_by=job.attempted_by, fence=job.fence, state=state, **fields
    )


def finalize(
    engine: BaseEngine, now: dt.datetime, *results: JobFinalize, **params: Any
) -> list[JobFinalized]:
    return engine.job_finalize_many(JobFinalizeParams(jobs=list(results), now=now, **params))


def get(engine: BaseEngine, job: JobRow | Any) -> JobRow:
    """``job_get`` that must find the job."""
    job_id = job.id if isinstance(job, JobRow) else job
    found = engine.job_get(job_id)
    assert found is not None, f"job {job_id} not found"
    return found


def live_ids(engine: BaseEngine, **filters: Any) -> list[Any]:
    rows = engine.job_list(JobListParams(states=LIVE_STATES, limit=1000, **filters))
    return [row.id for row in rows]


def list_ids(engine: BaseEngine, **filters: Any) -> list[Any]:
    filters.setdefault("limit", 1000)
    return [row.id for row in engine.job_list(JobListParams(**filters))]


def receive(listener: Listener, count: int, timeout: float = 5.0) -> list[Notification]:
    """Collect notifications until ``count`` arrived or ``timeout`` seconds passed."""
    got: list[Notification] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        got.extend(listener.next(min(left, 0.5)))
    return got


def store_raw(job_id: Any, column: str, text: str | None, *, json: bool = True) -> None:
    """Overwrite one stored value of a job, live or in history, as a hand-edited
    row or a foreign writer would (JSON columns take JSON text)."""
    sqlite = connection.vendor == "sqlite"
    key = job_id.hex if sqlite else job_id
    cast = "::jsonb" if json and not sqlite else ""
    with connection.cursor() as c:
        for table in ("hopper_job", "hopper_job_history"):
            c.execute(f"UPDATE {table} SET {column} = %s{cast} WHERE id = %s", [text, key])
