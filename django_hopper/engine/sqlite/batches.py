"""Batch methods of the SQLite engine; SQL in ``queries/batches.sql``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django_hopper.engine.params import (
    BatchDuplicatesParams,
    BatchDuplicatesResult,
    BatchInsertParams,
    BatchSettleParams,
    BatchSettleResult,
    JobInsertOpts,
    JobInsertParams,
)
from django_hopper.engine.rules import callback_to_json, callbacks_of
from django_hopper.engine.sqlite.convert import _loads, dumps, from_db_time
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.ids import new_id
from django_hopper.types import BatchRow, JobID


def batch_from_row(r: Sequence[Any]) -> BatchRow:
    """Build a BatchRow from (id, name, pending, failed, total, completed_at, created_at,
    metadata, is_workflow)."""
    return BatchRow(
        id=uuid.UUID(r[0]),
        name=r[1],
        pending=max(int(r[2]), 0),
        failed=int(r[3]),
        total=int(r[4]),
        completed_at=from_db_time(r[5]),
        created_at=from_db_time(r[6]),
        metadata=_loads(r[7]) if isinstance(r[7], str) else r[7],
        is_workflow=bool(r[8]),
    )


def stored_callbacks(
    on_success: JobInsertParams | None,
    on_failure: JobInsertParams | None,
    on_complete: JobInsertParams | None,
) -> dict[str, str | None]:
    """Return the three callback columns as JSON texts (or NULL)."""
    out: dict[str, str | None] = {}
    for name, p in (
        ("on_success", on_success),
        ("on_failure", on_failure),
        ("on_complete", on_complete),
    ):
        obj = callback_to_json(p)
        out[name] = None if obj is None else dumps(obj, name)
    return out


class BatchesMixin(SQLiteSupport):
    """batch_insert, batch_settle and batch_get."""

    @translate_errors
    def _batch_insert(self, params: BatchInsertParams) -> JobID:
        """Create a batch expecting ``total`` jobs."""
        total = params.total
        batch_id = params.id or new_id()
        _, now_s = self._now(params.now)
        with self._cursor() as c:
            c.execute(
                Q["batch_insert"],
                {
                    "id": batch_id.hex,
                    "name": None,
                    "is_workflow": 0,
                    "total": total,
                    "now": now_s,
                    "metadata": dumps(params.metadata, "metadata"),
                    **stored_callbacks(params.on_success, params.on_failure, params.on_complete),
                },
            )
        return batch_id

    @translate_errors
    def _batch_count_duplicates(self, params: BatchDuplicatesParams) -> BatchDuplicatesResult:
        """Join the waiting duplicates to their batches; count the rest as progress."""
        pairs = [[b.hex, j.hex] for b, j in params.duplicates]
        with self._atomic(), self._cursor() as c:
            c.execute(Q["batch_count_duplicates"], {"pairs": json.dumps(pairs)})
            joined = {r[0] for r in c.fetchall()}
            rest = [pair for pair in pairs if pair[1] not in joined]
            counted: list[Any] = []
            if rest:
                c.execute(Q["batch_count_duplicates.record"], {"pairs": json.dumps(rest)})
                counted = c.fetchall()
        return BatchDuplicatesResult(
            joined=len(joined),
            counted=sum(int(r[1]) for r in counted),
            batches=tuple(sorted(uuid.UUID(r[0]) for r in counted)),
        )

    @translate_errors
    def _batch_settle(self, params: BatchSettleParams) -> BatchSettleResult:
        """Fold progress and complete batches; insert the callbacks of those completed."""
        with self._atomic(), self._cursor() as c:
            result = self._settle(c, params)
        return result

    def _settle(self, c: Any, params: BatchSettleParams) -> BatchSettleResult:
        """Settle inside the caller's transaction (the finalize calls this too)."""
        now, now_s = self._now(params.now)
        if params.ids is not None:
            ids = sorted({i.hex for i in params.ids})
        else:
            after = params.after.hex if params.after is not None else ""
            c.execute(Q["batch_settle.sweep"], {"after": after, "limit": params.limit})
            ids = [r[0] for r in c.fetchall()]
        result = BatchSettleResult()
        if ids:
            ids_s = json.dumps(ids)
            c.execute(Q["batch_settle"], {"ids": ids_s})
            folded = sorted(r[0] for r in c.fetchall())
            c.execute(Q["batch_settle.folded"], {"ids": ids_s})
            result.folded = len(folded)
            result.last = uuid.UUID(folded[-1]) if folded else None
            c.execute(Q["batch_settle.complete"], {"ids": ids_s, "now": now_s})
            callbacks: list[JobInsertParams] = []
            for batch_hex, failed, *stored in sorted(c.fetchall()):
                result.completed += 1
                callbacks += callbacks_of(uuid.UUID(batch_hex), failed, stored)
            if callbacks:
                self.job_insert_many(callbacks, JobInsertOpts(notify=True, now=now))
        if params.ids is None and params.results:
            c.execute(Q["batch_settle.results"], {"limit": params.limit})
        return result

    @translate_errors
    def _batch_get(self, id: JobID) -> BatchRow | None:
        """Return a batch with the progress not yet folded counted in."""
        with self._cursor() as c:
            c.execute(Q["batch_get"], {"id": id.hex})
            row = c.fetchone()
        return None if row is None else batch_from_row(row)
