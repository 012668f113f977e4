"""Operator methods over many jobs at once: cancel, retry and delete, set-based.

Each call decides every job in one statement (queries/operator.sql) by the
rules of the one-job methods, and then does what those do after the change:
wake workers, tell a running job's client to stop, count waiting jobs a
cancel or delete took out toward their batches and workflows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from django_hopper.engine.params import (
    JobCancelManyParams,
    JobDeleteManyParams,
    JobRetryManyParams,
)
from django_hopper.engine.postgres.convert import job_from_row
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.engine.postgres.workflows import jobs_finished
from django_hopper.engine.queries import JOB_WIDTH
from django_hopper.types import (
    CHANNEL_CONTROL,
    CHANNEL_DONE,
    CHANNEL_INSERT,
    JobID,
    JobManyResult,
    JobOutcome,
    JobRow,
    JobState,
)


def unique_ids(ids: Sequence[JobID]) -> list[JobID]:
    """Return the IDs once each, in request order."""
    return list(dict.fromkeys(ids))


class OperatorMixin(PostgresSupport):
    """``job_cancel_many``, ``job_retry_many`` and ``job_delete_many``."""

    def _where(self, ids: Sequence[JobID]) -> dict[JobID, str]:
        """Return each found ID's live state, or "finished" for one only in history."""
        if not ids:
            return {}
        rows = self._fetchall("job_cancel_many.where", {"ids": list(ids)})
        return {row[0]: row[1] for row in rows}

    def _job_cancel_many(self, params: JobCancelManyParams) -> JobManyResult:
        """Cancel waiting jobs into history and ask running ones to stop, in one statement."""
        ids = unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        with db_errors(), self._atomic():
            jobs = [
                job_from_row(r)
                for r in self._fetchall("job_cancel_many", {"ids": ids, "now": params.now})
            ]
            running = [j for j in jobs if j.state == JobState.RUNNING]
            ended = [j for j in jobs if j.state != JobState.RUNNING]
            if running:
                self.notify(
                    CHANNEL_CONTROL,
                    [json.dumps({"action": "cancel", "job_id": str(j.id)}) for j in running],
                )
            awaited = [str(j.id) for j in ended if j.awaited]
            if awaited:
                self.notify(CHANNEL_DONE, awaited)
            jobs_finished(self, ended)
            changed = {j.id: j for j in jobs}
            where = self._where([i for i in ids if i not in changed])
        outcomes: dict[JobID, str] = {}
        for i in ids:
            if i in changed:
                running_now = changed[i].state == JobState.RUNNING
                outcomes[i] = JobOutcome.CANCEL_REQUESTED if running_now else JobOutcome.CANCELED
            else:
                outcomes[i] = JobOutcome.FINISHED if i in where else JobOutcome.NOT_FOUND
        return JobManyResult(outcomes=outcomes, jobs=jobs)

    def _job_retry_many(self, params: JobRetryManyParams) -> JobManyResult:
        """Run waiting jobs now and bring finished ones back, in a statement each."""
        ids = unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        values = {"from_start": bool(params.from_start), "now": params.now}
        outcomes: dict[JobID, str] = {}
        jobs: list[JobRow] = []
        with db_errors(), self._atomic():
            live = dict(self._fetchall("job_retry_many.lock", {"ids": ids}))
            waiting = [i for i, state in live.items() if state != JobState.RUNNING]
            if waiting:
                rows = self._fetchall("job_retry_many", {"ids": waiting, **values})
                jobs += [job_from_row(r) for r in rows]
            rest = [i for i in ids if i not in live]
            if rest:
                for row in self._fetchall("job_retry_many.history", {"ids": rest, **values}):
                    if row[1] is None:
                        outcomes[row[0]] = JobOutcome.UNIQUE_CONFLICT
                    else:
                        jobs.append(job_from_row(row[1 : 1 + JOB_WIDTH]))
            woken = sorted({j.queue for j in jobs if j.state == JobState.AVAILABLE})
            if woken:
                self.notify(CHANNEL_INSERT, woken)
        retried = {j.id for j in jobs}
        for i in ids:
            if i in retried:
                outcomes[i] = JobOutcome.RETRIED
            elif live.get(i) == JobState.RUNNING:
                outcomes[i] = JobOutcome.RUNNING
            else:
                outcomes.setdefault(i, JobOutcome.NOT_FOUND)
        return JobManyResult(outcomes={i: outcomes[i] for i in ids}, jobs=jobs)

    def _job_delete_many(self, params: JobDeleteManyParams) -> JobManyResult:
        """Delete jobs that are not running, live or from history, with their logs."""
        ids = unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        with db_errors(), self._atomic():
            deleted: dict[JobID, JobRow] = {}
            for row in self._fetchall("job_delete_many", {"ids": ids}):
                job = job_from_row(row)
                deleted.setdefault(job.id, job)
            waiting = [j for j in deleted.values() if j.is_live]
            awaited = [str(j.id) for j in waiting if j.awaited]
            if awaited:
                self.notify(CHANNEL_DONE, awaited)
            # Deleted while waiting: counted as canceled, as job_delete does.
            jobs_finished(self, [dataclasses.replace(j, state=JobState.CANCELED) for j in waiting])
            where = self._where([i for i in ids if i not in deleted])
        outcomes = {
            i: JobOutcome.DELETED
            if i in deleted
            else (JobOutcome.RUNNING if where.get(i) == JobState.RUNNING else JobOutcome.NOT_FOUND)
            for i in ids
        }
        return JobManyResult(outcomes=outcomes, jobs=list(deleted.values()))
