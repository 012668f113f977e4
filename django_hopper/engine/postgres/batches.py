"""Batch methods of the PostgreSQL engine (issue 5); SQL in ``queries/batches.sql``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_hopper.engine.base import (
    BatchInsertParams,
    BatchRow,
    BatchSettleParams,
    BatchSettleResult,
    BatchWorkflowContract,
    JobID,
    JobInsertOpts,
    JobInsertParams,
    callback_to_json,
    callbacks_of,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.exceptions import InvalidJob
from django_hopper.ids import new_id


def batch_from_row(r: Sequence[Any]) -> BatchRow:
    """Build a BatchRow from (id, name, pending, failed, total, completed_at, created_at,
    metadata, is_workflow)."""
    return BatchRow(
        id=r[0],
        name=r[1],
        pending=max(int(r[2]), 0),
        failed=int(r[3]),
        total=int(r[4]),
        completed_at=r[5],
        created_at=r[6],
        metadata=convert.load_json(r[7]),
        is_workflow=bool(r[8]),
    )


def check_callbacks(*callbacks: JobInsertParams | None) -> None:
    """Refuse a callback the insert at completion would refuse, before anything is written."""
    for p in callbacks:
        if p is not None:
            convert.validate_insert(p)


def _json_or_none(value: Any, field: str) -> str | None:
    return None if value is None else convert.dump_json(value, field)


class BatchesMixin(PostgresSupport, BatchWorkflowContract):
    """batch_insert, batch_settle and batch_get."""

    def batch_insert(self, params: BatchInsertParams) -> JobID:
        """Create a batch expecting ``total`` jobs."""
        total = params.total
        if not isinstance(total, int) or isinstance(total, bool) or total < 0:
            raise InvalidJob(f"total must be a non-negative integer, not {total!r}", field="total")
        check_callbacks(params.on_success, params.on_failure, params.on_complete)
        batch_id = params.id or new_id()
        self._fetchone(
            "batch_insert",
            {
                "id": batch_id,
                "name": None,
                "is_workflow": False,
                "total": total,
                "now": params.now,
                "metadata": convert.dump_json(params.metadata, "metadata"),
                "on_success": _json_or_none(callback_to_json(params.on_success), "on_success"),
                "on_failure": _json_or_none(callback_to_json(params.on_failure), "on_failure"),
                "on_complete": _json_or_none(callback_to_json(params.on_complete), "on_complete"),
            },
        )
        return batch_id

    def batch_settle(self, params: BatchSettleParams) -> BatchSettleResult:
        """Fold progress and complete batches; insert the callbacks of those completed."""
        if params.ids is not None and not params.ids:
            return BatchSettleResult()
        if not isinstance(params.limit, int) or params.limit < 0:
            raise InvalidJob(f"limit must be a non-negative integer, not {params.limit!r}")
        result = BatchSettleResult()
        with db_errors(), self._atomic():
            if params.ids is not None:
                rows = self._fetchall(
                    "batch_settle", {"ids": sorted(set(params.ids)), "now": params.now}
                )
            else:
                rows = self._fetchall(
                    "batch_settle.sweep",
                    {"after": params.after, "limit": params.limit, "now": params.now},
                )
            callbacks: list[JobInsertParams] = []
            for batch_id, completed, failed, *stored in rows:
                result.folded += 1
                result.last = batch_id
                if completed:
                    result.completed += 1
                    callbacks += callbacks_of(
                        batch_id, failed, [convert.load_json(s) for s in stored]
                    )
            if callbacks:
                self.job_insert_many(callbacks, JobInsertOpts(notify=True, now=params.now))
            if params.ids is None and params.results:
                self._execute("batch_settle.results", {"limit": params.limit})
        return result

    def batch_get(self, id: JobID) -> BatchRow | None:
        """Return a batch with the progress not yet folded counted in."""
        row = self._fetchone("batch_get", {"id": id})
        return batch_from_row(row) if row else None
