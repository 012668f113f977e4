"""Operator statements of the PostgreSQL engine: cancel, retry and delete, set-based.

Each hook decides every job in one statement (queries/operator.sql) and
counts waiting jobs a cancel or delete took out toward their batches and
workflows; the front (``BaseEngine.job_cancel_many`` ...) turns what it
reports into outcomes, errors and notifications.
"""

from __future__ import annotations

from collections.abc import Sequence

from django_hopper.engine.outcomes import OperatorRows, ended_by_delete, last_stored
from django_hopper.engine.params import (
    JobCancelManyParams,
    JobDeleteManyParams,
    JobRetryManyParams,
)
from django_hopper.engine.postgres.convert import job_from_row
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.engine.postgres.workflows import jobs_finished
from django_hopper.engine.queries import JOB_WIDTH
from django_hopper.types import JobID, JobOutcome, JobState


class OperatorMixin(PostgresSupport):
    """``_job_cancel_many``, ``_job_retry_many`` and ``_job_delete_many``."""

    def _where(self, ids: Sequence[JobID]) -> dict[JobID, str]:
        """Return each found ID's live state, or "finished" for one only in history."""
        if not ids:
            return {}
        rows = self._fetchall("job_cancel_many.where", {"ids": list(ids)})
        return {row[0]: row[1] for row in rows}

    def _job_cancel_many(self, params: JobCancelManyParams) -> OperatorRows:
        """Cancel waiting jobs into history and ask running ones to stop, in one statement."""
        with db_errors(), self._atomic():
            rows = self._fetchall("job_cancel_many", {"ids": list(params.ids), "now": params.now})
            jobs = [job_from_row(r) for r in rows]
            jobs_finished(self, [j for j in jobs if j.state != JobState.RUNNING])
            changed = {j.id for j in jobs}
            where = self._where([i for i in params.ids if i not in changed])
        return OperatorRows(jobs, {i: JobOutcome.FINISHED for i in where})

    def _job_retry_many(self, params: JobRetryManyParams) -> OperatorRows:
        """Run waiting jobs now and bring finished ones back, in a statement each."""
        values = {"from_start": bool(params.from_start), "now": params.now}
        done = OperatorRows()
        with db_errors(), self._atomic():
            live = dict(self._fetchall("job_retry_many.lock", {"ids": list(params.ids)}))
            waiting = [i for i, state in live.items() if state != JobState.RUNNING]
            if waiting:
                rows = self._fetchall("job_retry_many", {"ids": waiting, **values})
                done.changed += [job_from_row(r) for r in rows]
            rest = [i for i in params.ids if i not in live]
            if rest:
                for row in self._fetchall("job_retry_many.history", {"ids": rest, **values}):
                    if row[1] is None:
                        done.left[row[0]] = JobOutcome.UNIQUE_CONFLICT
                    else:
                        done.changed.append(job_from_row(row[1 : 1 + JOB_WIDTH]))
        done.left.update({i: JobOutcome.RUNNING for i, s in live.items() if s == JobState.RUNNING})
        return done

    def _job_delete_many(self, params: JobDeleteManyParams) -> OperatorRows:
        """Delete jobs that are not running, live or from history, with their logs."""
        with db_errors(), self._atomic():
            rows = self._fetchall("job_delete_many", {"ids": list(params.ids)})
            deleted = last_stored([job_from_row(r) for r in rows])
            jobs_finished(self, ended_by_delete(deleted.values()))
            where = self._where([i for i in params.ids if i not in deleted])
        running = {i: JobOutcome.RUNNING for i, s in where.items() if s == JobState.RUNNING}
        return OperatorRows(list(deleted.values()), running)
