"""Operator methods over many jobs at once: cancel, retry and delete, set-based.

Each call decides every job with a few statements over the whole set
(queries/operator.sql; IDs passed as one JSON array) by the rules of the
one-job methods, then does what those do after the change: wake workers,
tell a running job's client to stop, count waiting jobs a cancel or delete
took out toward their batches and workflows.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django_hopper.engine.params import (
    JobCancelManyParams,
    JobDeleteManyParams,
    JobRetryManyParams,
)
from django_hopper.engine.sqlite.convert import job_from_row
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.engine.sqlite.workflows import finished_of, jobs_finished
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


def _json_ids(ids: Sequence[JobID]) -> str:
    return json.dumps([i.hex for i in ids])


class OperatorMixin(SQLiteSupport):
    """``job_cancel_many``, ``job_retry_many`` and ``job_delete_many``."""

    def _rows(self, c: Any, ids: Sequence[JobID]) -> dict[JobID, JobRow]:
        """Read the jobs, live first then history, by ID."""
        if not ids:
            return {}
        c.execute(Q["job_cancel_many.rows"], {"ids": _json_ids(ids)})
        found: dict[JobID, JobRow] = {}
        for row in c.fetchall():
            job = job_from_row(row)
            found.setdefault(job.id, job)
        return found

    @translate_errors
    def _job_cancel_many(self, params: JobCancelManyParams) -> JobManyResult:
        """Cancel waiting jobs into history and ask running ones to stop."""
        ids = unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        now, now_s = self._now(params.now)
        args = {"ids": _json_ids(ids), "now": now_s, "at": now.astimezone(dt.UTC).isoformat()}
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_cancel_many"], args)
            c.execute(Q["job_cancel_many.delete"], args)
            moved = {uuid.UUID(r[0]): bool(r[1]) for r in c.fetchall()}
            c.execute(Q["job_cancel_many.request"], args)
            requested = [uuid.UUID(r[0]) for r in c.fetchall()]
            rows = self._rows(c, ids)
            ended = [rows[i] for i in moved if i in rows]
            awaited = [str(i) for i, flag in moved.items() if flag]
            if awaited:
                self.notify(CHANNEL_DONE, awaited)
            jobs_finished(self, c, finished_of(ended), params.now)
        if requested:
            self.notify(
                CHANNEL_CONTROL,
                [json.dumps({"action": "cancel", "job_id": str(i)}) for i in requested],
            )
        outcomes: dict[JobID, str] = {}
        for i in ids:
            if i in moved:
                outcomes[i] = JobOutcome.CANCELED
            elif i in requested:
                outcomes[i] = JobOutcome.CANCEL_REQUESTED
            else:
                outcomes[i] = JobOutcome.FINISHED if i in rows else JobOutcome.NOT_FOUND
        changed = [rows[i] for i in ids if i in rows and outcomes[i] != JobOutcome.FINISHED]
        return JobManyResult(outcomes=outcomes, jobs=changed)

    @translate_errors
    def _job_retry_many(self, params: JobRetryManyParams) -> JobManyResult:
        """Run waiting jobs now and bring finished ones back to live."""
        ids = unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        _, now_s = self._now(params.now)
        args = {"ids": _json_ids(ids), "now": now_s, "from_start": 1 if params.from_start else 0}
        with self._atomic(), self._cursor() as c:
            before = self._rows(c, ids)
            c.execute(Q["job_retry_many.live"], args)
            woken = {uuid.UUID(r[0]) for r in c.fetchall()}
            c.execute(Q["job_retry_many"], args)
            c.execute(Q["job_retry_many.history_delete"], args)
            after = self._rows(c, ids)
        outcomes: dict[JobID, str] = {}
        jobs: list[JobRow] = []
        for i in ids:
            was, now_row = before.get(i), after.get(i)
            if was is None:
                outcomes[i] = JobOutcome.NOT_FOUND
            elif was.state == JobState.RUNNING:
                outcomes[i] = JobOutcome.RUNNING
            elif i in woken or (now_row is not None and now_row.is_live):
                outcomes[i] = JobOutcome.RETRIED
                if now_row is not None:
                    jobs.append(now_row)
            else:
                outcomes[i] = JobOutcome.UNIQUE_CONFLICT
        queues = sorted({j.queue for j in jobs})
        if queues:
            self.notify(CHANNEL_INSERT, queues)
        return JobManyResult(outcomes=outcomes, jobs=jobs)

    @translate_errors
    def _job_delete_many(self, params: JobDeleteManyParams) -> JobManyResult:
        """Delete jobs that are not running, live or from history, with their logs."""
        ids = unique_ids(params.ids)
        if not ids:
            return JobManyResult(outcomes={})
        args = {"ids": _json_ids(ids)}
        deleted: dict[JobID, JobRow] = {}
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_delete_many"], args)
            waiting = [job_from_row(r) for r in c.fetchall()]
            c.execute(Q["job_delete_many.history"], args)
            finished = [job_from_row(r) for r in c.fetchall()]
            for job in (*waiting, *finished):
                deleted.setdefault(job.id, job)
            if deleted:
                c.execute(Q["job_delete_many.logs"], {"ids": _json_ids(list(deleted))})
                c.execute(Q["job_delete_many.steps"], {"ids": _json_ids(list(deleted))})
            # Deleted while waiting: counted as canceled, as job_delete does.
            for job in waiting:
                job.state = JobState.CANCELED
            jobs_finished(self, c, finished_of(waiting), None)
            left = self._rows(c, [i for i in ids if i not in deleted])
        awaited = [str(j.id) for j in waiting if j.awaited]
        if awaited:
            self.notify(CHANNEL_DONE, awaited)
        outcomes = {
            i: JobOutcome.DELETED
            if i in deleted
            else (JobOutcome.RUNNING if i in left else JobOutcome.NOT_FOUND)
            for i in ids
        }
        return JobManyResult(outcomes=outcomes, jobs=list(deleted.values()))
