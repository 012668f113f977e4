"""Job leases of the PostgreSQL engine: claim by ID, renewal and expiry.

The token is generated in the claim statement (``gen_random_uuid()``). The
expiry selects the due leases with SKIP LOCKED and ends each attempt through
the ordinary finalize, fenced to the lease, so history, batches, workflow
dependents and done notifications follow the one path every result takes.
"""

from __future__ import annotations

from django.db import transaction

from django_hopper.engine.params import (
    JobClaimByIDParams,
    JobExpireLeasesParams,
    JobFinalizeParams,
    JobLeaseRenewParams,
    JobLeaseRow,
    JobLeaseStatus,
    JobListParams,
)
from django_hopper.engine.postgres.convert import job_from_row
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.engine.postgres.workflows import attach_dependencies
from django_hopper.engine.queries import COL, JOB_WIDTH
from django_hopper.engine.rules import lease_expiry_result
from django_hopper.types import JobRow, LeaseFence


class LeasesMixin(PostgresSupport):
    """job_claim_by_id, job_lease_renew and job_expire_leases."""

    def _job_claim_by_id(self, params: JobClaimByIDParams) -> JobLeaseRow | str:
        """Lock the job's row (waiting for a holder unless ``no_wait``), then claim
        it or say why not."""
        values = {"id": params.id, "fence": params.fence, "ttl": params.ttl, "now": params.now}
        lock = "job_claim_by_id.lock.no_wait" if params.no_wait else "job_claim_by_id.lock"
        # A refused lock aborts the transaction: a savepoint keeps the caller's usable.
        savepoint = params.no_wait and self.connection.in_atomic_block
        with db_errors(), transaction.atomic(using=self.alias, savepoint=savepoint):
            self._fetchone(lock, values)
            row = self._fetchone("job_claim_by_id", values)
        if row is None or row[0] != "claimed":
            return str(row[0]) if row else "not_found"
        job = job_from_row(row[1 : 1 + JOB_WIDTH])
        token, expires_at = row[1 + COL.lease_token], row[1 + COL.lease_expires_at]
        if job.decode_error is None:
            job = attach_dependencies(self, [job])[0]
        return JobLeaseRow(job=job, lease=LeaseFence(token, job.fence), expires_at=expires_at)

    def _job_lease_renew(self, params: JobLeaseRenewParams) -> JobLeaseStatus | None:
        """Extend the lease by its TTL; None once it is no longer the job's."""
        row = self._fetchone(
            "job_lease_renew",
            {
                "id": params.id,
                "fence": params.lease.fence,
                "token": params.lease.token,
                "now": params.now,
            },
        )
        if row is None:
            return None
        return JobLeaseStatus(expires_at=row[0], cancel_requested=bool(row[1]))

    def _job_expire_leases(self, params: JobExpireLeasesParams) -> list[JobRow]:
        """End the attempts of the due leases, fenced to each lease, in one transaction."""
        values = {
            "client_id": params.client_id,
            "grace": params.grace,
            "limit": params.limit,
            "now": params.now,
        }
        with db_errors(), self._atomic():
            rows = self._fetchall("job_expire_leases", values)
            if not rows:
                return []
            results = [lease_expiry_result(job_from_row(r), r[COL.lease_token]) for r in rows]
            applied = self.job_finalize_many(JobFinalizeParams(jobs=results, now=params.now))
        ids = tuple(f.id for f in applied)
        if not ids:
            return []
        return self.job_list(JobListParams(ids=ids, limit=len(ids)))
