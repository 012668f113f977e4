"""Job leases of the SQLite engine: claim by ID, renewal and expiry.

SQLite has no UUID function. The engine is embedded, so the claim's token is
a random UUID made by Python's :func:`uuid.uuid4` in the process that runs the
statement, inside the same IMMEDIATE transaction; nothing outside that
transaction sees it before it commits. The expiry ends each due attempt
through the ordinary finalize, fenced to the lease, so history, batches,
workflow dependents and done notifications follow the one path every result
takes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django_hopper.engine.params import (
    JobClaimByIDParams,
    JobExpireLeasesParams,
    JobFinalizeParams,
    JobLeaseRenewParams,
    JobLeaseRow,
    JobLeaseStatus,
    JobListParams,
)
from django_hopper.engine.queries import COL
from django_hopper.engine.rules import lease_expiry_result
from django_hopper.engine.sqlite.convert import db_time, from_db_time, job_from_row
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.engine.sqlite.workflows import attach_dependencies
from django_hopper.types import JobRow, LeaseFence

_MICROSECOND = dt.timedelta(microseconds=1)


class LeasesMixin(SQLiteSupport):
    """job_claim_by_id, job_lease_renew and job_expire_leases."""

    @translate_errors
    def _job_claim_by_id(self, params: JobClaimByIDParams) -> JobLeaseRow | str:
        """Claim the job under a new lease, or say why not, in one write transaction."""
        now, now_s = self._now(params.now)
        args = {
            "id": params.id.hex,
            "fence": params.fence,
            "now": now_s,
            "token": uuid.uuid4().hex,
            "expires_at": db_time(now + params.ttl),
        }
        if params.no_wait:
            with self._cursor() as c, self._job_write_no_wait(c, "job_claim_by_id", params.id):
                row, status = self._claim_by_id(c, args)
        else:
            with self._atomic(), self._cursor() as c:
                row, status = self._claim_by_id(c, args)
        if row is None:
            return status
        job = job_from_row(row)
        if job.batch_id is not None and job.decode_error is None:
            job = attach_dependencies(self, [job])[0]
        expires_at = from_db_time(row[COL.lease_expires_at])
        return JobLeaseRow(
            job=job,
            lease=LeaseFence(uuid.UUID(row[COL.lease_token]), job.fence),
            expires_at=expires_at,
        )

    def _claim_by_id(self, c: Any, args: dict[str, Any]) -> tuple[Any, str]:
        """Run the claim; without a row, ask why (in the same transaction)."""
        c.execute(Q["job_claim_by_id"], args)
        row = c.fetchone()
        if row is not None:
            return row, "claimed"
        c.execute(Q["job_claim_by_id.status"], args)
        return None, str(c.fetchone()[0])

    @translate_errors
    def _job_lease_renew(self, params: JobLeaseRenewParams) -> JobLeaseStatus | None:
        """Extend the lease by its TTL; None once it is no longer the job's."""
        _, now_s = self._now(params.now)
        args = {
            "id": params.id.hex,
            "fence": params.lease.fence,
            "token": params.lease.token.hex,
            "now": now_s,
        }
        with self._cursor() as c:
            c.execute(Q["job_lease_renew"], args)
            row = c.fetchone()
        if row is None:
            return None
        return JobLeaseStatus(expires_at=from_db_time(row[0]), cancel_requested=row[1] is not None)

    @translate_errors
    def _job_expire_leases(self, params: JobExpireLeasesParams) -> list[JobRow]:
        """End the attempts of the due leases, fenced to each lease, in one transaction."""
        _, now_s = self._now(params.now)
        args = {
            "client_id": params.client_id,
            "grace_us": params.grace // _MICROSECOND,
            "limit": params.limit,
            "now": now_s,
        }
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_expire_leases"], args)
            rows = c.fetchall()
            if not rows:
                return []
            results = [
                lease_expiry_result(job_from_row(r), uuid.UUID(r[COL.lease_token])) for r in rows
            ]
            applied = self.job_finalize_many(JobFinalizeParams(jobs=results, now=params.now))
        ids = tuple(f.id for f in applied)
        if not ids:
            return []
        return self.job_list(JobListParams(ids=ids, limit=len(ids)))
