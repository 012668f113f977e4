"""The step ledger of resumable jobs, SQLite: read a step at its boundary, record
a step's try and clear the ledger when a pass commits, each fenced to the claim.

Each operation runs its claim test and its write in one IMMEDIATE transaction,
so no other writer can take the job between them.
"""

from __future__ import annotations

import json
from typing import Any

from django_hopper.engine.params import JobStepGetParams, JobStepRecordParams, JobStepsClearParams
from django_hopper.engine.rules import step_from_row
from django_hopper.engine.sqlite.convert import dumps, from_db_time
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.types import JobID, JobStepRow


def _row(r: Any) -> JobStepRow:
    result = json.loads(r[2]) if r[2] is not None else None
    return step_from_row(JobID(r[0]), r[1], result, r[3], r[4], from_db_time(r[5]))


class StepsMixin(SQLiteSupport):
    """job_step_get, job_step_record, job_steps_clear and job_steps."""

    def _claim(
        self, params: JobStepGetParams | JobStepRecordParams | JobStepsClearParams
    ) -> dict[str, Any]:
        """Return the claim's parameters, the ones every ledger statement is fenced on."""
        _, now_s = self._now(params.now)
        return {
            "id": params.id.hex,
            "attempted_by": params.attempted_by,
            "fence": params.fence,
            "lease_token": params.lease_token.hex if params.lease_token else None,
            "now": now_s,
        }

    @translate_errors
    def _job_step_get(self, params: JobStepGetParams) -> tuple[bool, JobStepRow | None]:
        """Test the claim (renewing a lease), then read the step."""
        args = {**self._claim(params), "step": params.step}
        row = None
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_step_get"], args)
            owned = c.fetchone() is not None
            if owned:
                c.execute(Q["job_step_get.read"], args)
                row = c.fetchone()
        return owned, None if row is None else _row(row)

    @translate_errors
    def _job_step_record(self, params: JobStepRecordParams) -> JobStepRow | None:
        """Test the claim (renewing a lease) and upsert one try of a step."""
        result = dumps({"value": params.result}, "result") if params.done else None
        args = {**self._claim(params), "step": params.step, "result": result, "error": params.error}
        row = None
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_step_get"], args)
            if c.fetchone() is not None:
                c.execute(Q["job_step_record"], args)
                row = c.fetchone()
        return None if row is None else _row(row)

    @translate_errors
    def _job_steps_clear(self, params: JobStepsClearParams) -> int | None:
        """Drop the ledger as the owning claim; None (nothing dropped) otherwise."""
        args = {**self._claim(params), "reset_attempt": 1 if params.reset_attempt else 0}
        dropped: int | None = None
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_steps_clear"], args)
            if c.fetchone() is not None:
                c.execute(Q["job_steps_clear.delete"], args)
                dropped = int(c.rowcount)
        return dropped

    @translate_errors
    def _job_steps(self, id: JobID) -> list[JobStepRow]:
        """Return the ledger, in the order steps were first tried."""
        with self._cursor() as c:
            c.execute(Q["job_steps"], {"id": id.hex})
            return [_row(r) for r in c.fetchall()]
