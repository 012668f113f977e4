"""The step ledger of resumable jobs, PostgreSQL: read a step at its boundary,
record a step's try and clear the ledger when a pass commits, each fenced to
the claim."""

from __future__ import annotations

from typing import Any

from django_hopper.engine.params import JobStepGetParams, JobStepRecordParams, JobStepsClearParams
from django_hopper.engine.postgres.convert import dump_json, load_json
from django_hopper.engine.postgres.support import PostgresSupport
from django_hopper.engine.rules import step_from_row
from django_hopper.types import JobID, JobStepRow


def _claim(params: JobStepGetParams | JobStepRecordParams | JobStepsClearParams) -> dict[str, Any]:
    """Return the claim's parameters, the ones every ledger statement is fenced on."""
    return {
        "id": params.id,
        "attempted_by": params.attempted_by,
        "fence": params.fence,
        "lease_token": params.lease_token,
        "now": params.now,
    }


def _row(r: Any) -> JobStepRow:
    return step_from_row(r[0], r[1], load_json(r[2]), r[3], r[4], r[5])


class StepsMixin(PostgresSupport):
    """job_step_get, job_step_record, job_steps_clear and job_steps."""

    def _job_step_get(self, params: JobStepGetParams) -> tuple[bool, JobStepRow | None]:
        """Read a step as the owning claim, renewing a lease in the same statement."""
        row = self._fetchone("job_step_get", {**_claim(params), "step": params.step})
        if row is None or not row[0]:
            return False, None
        return True, None if row[1] is None else _row(row[1:])

    def _job_step_record(self, params: JobStepRecordParams) -> JobStepRow | None:
        """Upsert one try of a step, only while the claim owns the job."""
        result = dump_json({"value": params.result}, "result") if params.done else None
        row = self._fetchone(
            "job_step_record",
            {**_claim(params), "step": params.step, "result": result, "error": params.error},
        )
        return None if row is None else _row(row)

    def _job_steps_clear(self, params: JobStepsClearParams) -> int | None:
        """Drop the ledger as the owning claim; None (nothing dropped) otherwise."""
        row = self._fetchone(
            "job_steps_clear", {**_claim(params), "reset_attempt": bool(params.reset_attempt)}
        )
        return None if row is None or not row[0] else int(row[1])

    def _job_steps(self, id: JobID) -> list[JobStepRow]:
        """Return the ledger, in the order steps were first tried."""
        return [_row(r) for r in self._fetchall("job_steps", {"id": id})]
