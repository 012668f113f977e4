"""Pass leases of resumable runs, PostgreSQL: BEGIN, admission misses and
takeover of expired pass leases. SQL and rows only: the base's front decides
how a miss or a takeover ends the attempt (engine/rules.py)."""

from __future__ import annotations

from typing import Any

from django_hopper.engine.params import (
    JobPassBeginParams,
    JobPassBegun,
    JobPassMissParams,
    JobPassRow,
    JobPassTakeoverParams,
)
from django_hopper.engine.postgres.convert import job_from_row
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.engine.queries import COL, JOB_WIDTH
from django_hopper.types import JobID, JobRow, LeaseFence


def _claim(params: JobPassBeginParams | JobPassMissParams) -> dict[str, Any]:
    return {
        "id": params.id,
        "fence": params.fence,
        "attempted_by": None if params.lease_token else params.attempted_by,
        "lease_token": params.lease_token,
        "now": params.now,
    }


class PassesMixin(PostgresSupport):
    """job_pass_begin, job_pass_miss, job_pass_takeover_many and job_pass_get_many."""

    def _job_pass_begin(self, params: JobPassBeginParams) -> JobPassBegun | None:
        """BEGIN the pass (one compare-and-set); None when it does not hold."""
        row = self._fetchone(
            "job_pass_begin", {**_claim(params), "ttl": params.ttl, "margin": params.margin}
        )
        if row is None:
            return None
        return JobPassBegun(lease=LeaseFence(row[0], row[1]), expires_at=row[2])

    def _job_pass_miss(self, params: JobPassMissParams) -> tuple[JobRow, int] | None:
        """Count the miss on the claim's row; None when the claim lost it or began."""
        row = self._fetchone("job_pass_miss", _claim(params))
        if row is None:
            return None
        return job_from_row(row[:JOB_WIDTH]), int(row[JOB_WIDTH])

    def _job_pass_expired(
        self, params: JobPassTakeoverParams
    ) -> list[tuple[JobRow, JobID, bool, int]]:
        """Lock the expired pass leases and count the misses of those never begun."""
        values = {
            "kinds": list(params.kinds),
            "queue": params.queue,
            "limit": params.limit,
            "now": params.now,
        }
        with db_errors():
            rows = self._fetchall("job_pass_takeover_many", values)
        return [
            (
                job_from_row(r[:JOB_WIDTH]),
                r[COL.lease_token],
                r[JOB_WIDTH] is not None,
                int(r[JOB_WIDTH + 1]),
            )
            for r in rows
        ]

    def _job_pass_get_many(self, ids: list[JobID]) -> list[JobPassRow]:
        rows = self._fetchall("job_pass_get_many", {"ids": ids})
        return [
            JobPassRow(id=r[0], began_at=r[1], admission_misses=int(r[2]), lease_expires_at=r[3])
            for r in rows
        ]
