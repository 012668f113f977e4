"""Operator statements of the SQLite engine: cancel, retry and delete, set-based.

Each hook decides every job with a few statements over the whole set
(queries/operator.sql; IDs passed as one JSON array) and counts waiting jobs
a cancel or delete took out toward their batches and workflows; the front
(``BaseEngine.job_cancel_many`` ...) turns what it reports into outcomes,
errors and notifications.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django_hopper.engine.outcomes import OperatorRows, ended_by_delete, last_stored
from django_hopper.engine.params import (
    JobCancelManyParams,
    JobDeleteManyParams,
    JobRetryManyParams,
)
from django_hopper.engine.sqlite.convert import job_from_row
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.engine.sqlite.workflows import finished_of, jobs_finished
from django_hopper.types import JobID, JobOutcome, JobRow, JobState


def _json_ids(ids: Sequence[JobID]) -> str:
    return json.dumps([i.hex for i in ids])


class OperatorMixin(SQLiteSupport):
    """``_job_cancel_many``, ``_job_retry_many`` and ``_job_delete_many``."""

    def _rows(self, c: Any, ids: Sequence[JobID]) -> dict[JobID, JobRow]:
        """Read the jobs, live or from history, each as last stored."""
        if not ids:
            return {}
        c.execute(Q["job_cancel_many.rows"], {"ids": _json_ids(ids)})
        return last_stored([job_from_row(row) for row in c.fetchall()])

    @translate_errors
    def _job_cancel_many(self, params: JobCancelManyParams) -> OperatorRows:
        """Cancel waiting jobs into history and ask running ones to stop."""
        now, now_s = self._now(params.now)
        args = {
            "ids": _json_ids(params.ids),
            "now": now_s,
            "at": now.astimezone(dt.UTC).isoformat(),
        }
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_cancel_many"], args)
            c.execute(Q["job_cancel_many.delete"], args)
            moved = {uuid.UUID(r[0]) for r in c.fetchall()}
            c.execute(Q["job_cancel_many.request"], args)
            requested = {uuid.UUID(r[0]) for r in c.fetchall()}
            rows = self._rows(c, params.ids)
            jobs_finished(self, c, finished_of([rows[i] for i in moved]), params.now)
        changed = moved | requested
        left = {i: JobOutcome.FINISHED for i in rows if i not in changed}
        return OperatorRows([rows[i] for i in params.ids if i in changed], left)

    @translate_errors
    def _job_retry_many(self, params: JobRetryManyParams) -> OperatorRows:
        """Run waiting jobs now and bring finished ones back to live."""
        _, now_s = self._now(params.now)
        args = {
            "ids": _json_ids(params.ids),
            "now": now_s,
            "from_start": 1 if params.from_start else 0,
        }
        with self._atomic(), self._cursor() as c:
            before = self._rows(c, params.ids)
            c.execute(Q["job_retry_many.live"], args)
            c.fetchall()
            c.execute(Q["job_retry_many"], args)
            c.execute(Q["job_retry_many.history_delete"], args)
            after = self._rows(c, params.ids)
        done = OperatorRows()
        for i, was in before.items():
            if was.state == JobState.RUNNING:
                done.left[i] = JobOutcome.RUNNING
            elif after[i].is_live:
                done.changed.append(after[i])
            else:
                done.left[i] = JobOutcome.UNIQUE_CONFLICT
        return done

    @translate_errors
    def _job_delete_many(self, params: JobDeleteManyParams) -> OperatorRows:
        """Delete jobs that are not running, live or from history, with their logs."""
        args = {"ids": _json_ids(params.ids)}
        with self._atomic(), self._cursor() as c:
            c.execute(Q["job_delete_many"], args)
            waiting = [job_from_row(r) for r in c.fetchall()]
            c.execute(Q["job_delete_many.history"], args)
            deleted = last_stored([*waiting, *(job_from_row(r) for r in c.fetchall())])
            if deleted:
                c.execute(Q["job_delete_many.logs"], {"ids": _json_ids(list(deleted))})
                c.execute(Q["job_delete_many.steps"], {"ids": _json_ids(list(deleted))})
            jobs_finished(self, c, finished_of(ended_by_delete(deleted.values())), None)
            left = self._rows(c, [i for i in params.ids if i not in deleted])
        running = {i: JobOutcome.RUNNING for i in left}
        return OperatorRows(list(deleted.values()), running)
