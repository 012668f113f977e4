"""Pass leases of resumable runs, SQLite: BEGIN, admission misses and takeover
of expired pass leases. SQL and rows only: the base's front decides how a miss
or a takeover ends the attempt (engine/rules.py).

As for a claim by ID, the pass lease's token is a random UUID made by Python
in the process that runs the statement, inside its IMMEDIATE transaction.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django_hopper.engine.params import (
    JobPassBeginParams,
    JobPassBegun,
    JobPassMissParams,
    JobPassRow,
    JobPassTakeoverParams,
)
from django_hopper.engine.queries import COL, JOB_WIDTH
from django_hopper.engine.sqlite.convert import db_time, from_db_time, job_from_row
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.types import JobID, JobRow, LeaseFence


class PassesMixin(SQLiteSupport):
    """job_pass_begin, job_pass_miss, job_pass_takeover_many and job_pass_get_many."""

    def _pass_claim(self, params: JobPassBeginParams | JobPassMissParams) -> dict[str, Any]:
        _, now_s = self._now(params.now)
        return {
            "id": params.id.hex,
            "fence": params.fence,
            "attempted_by": None if params.lease_token else params.attempted_by,
            "lease_token": params.lease_token.hex if params.lease_token else None,
            "now": now_s,
        }

    @translate_errors
    def _job_pass_begin(self, params: JobPassBeginParams) -> JobPassBegun | None:
        """BEGIN the pass (one compare-and-set); None when it does not hold."""
        now, _ = self._now(params.now)
        args = {
            **self._pass_claim(params),
            "token": uuid.uuid4().hex,
            "expires_at": db_time(now + params.ttl),
            "hold_until": db_time(now + params.margin),
            "claimed_after": db_time(now + params.margin - params.ttl),
        }
        args["now"] = db_time(now)
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_pass_begin"], args)
            row = c.fetchone()
        if row is None:
            return None
        return JobPassBegun(
            lease=LeaseFence(uuid.UUID(row[0]), int(row[1])), expires_at=from_db_time(row[2])
        )

    @translate_errors
    def _job_pass_miss(self, params: JobPassMissParams) -> tuple[JobRow, int] | None:
        """Count the miss on the claim's row; None when the claim lost it or began."""
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_pass_miss"], self._pass_claim(params))
            row = c.fetchone()
        if row is None:
            return None
        return job_from_row(row[:JOB_WIDTH]), int(row[JOB_WIDTH])

    @translate_errors
    def _job_pass_expired(
        self, params: JobPassTakeoverParams
    ) -> list[tuple[JobRow, JobID, bool, int]]:
        """Take the expired pass leases and count the misses of those never begun."""
        _, now_s = self._now(params.now)
        args = {
            "kinds": json.dumps(list(params.kinds)),
            "queue": params.queue,
            "limit": params.limit,
            "now": now_s,
        }
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_pass_takeover_many"], args)
            rows = c.fetchall()
        return [
            (
                job_from_row(r[:JOB_WIDTH]),
                uuid.UUID(r[COL.lease_token]),
                r[JOB_WIDTH] is not None,
                int(r[JOB_WIDTH + 1]),
            )
            for r in rows
        ]

    @translate_errors
    def _job_pass_get_many(self, ids: list[JobID]) -> list[JobPassRow]:
        with self._cursor() as c:
            c.execute(Q["job_pass_get_many"], {"ids": json.dumps([i.hex for i in ids])})
            rows = c.fetchall()
        return [
            JobPassRow(
                id=uuid.UUID(r[0]),
                began_at=from_db_time(r[1]) if r[1] else None,
                admission_misses=int(r[2]),
                lease_expires_at=from_db_time(r[3]) if r[3] else None,
            )
            for r in rows
        ]
