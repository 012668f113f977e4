"""Batch methods of the PostgreSQL engine; SQL in ``queries/batches.sql``."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import transaction

from django_hopper.engine.params import (
    BatchDuplicatesParams,
    BatchDuplicatesResult,
    BatchInsertParams,
    BatchSettleParams,
    BatchSettleResult,
    JobInsertOpts,
    JobInsertParams,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.support import QUERIES, PostgresSupport, db_errors
from django_hopper.engine.rules import callback_to_json, callbacks_of
from django_hopper.exceptions import JobLocked
from django_hopper.ids import new_id
from django_hopper.types import BatchRow, JobID

T = TypeVar("T")
_FOR_UPDATE = re.compile(r"FOR UPDATE(?: OF \w+)?")

#: How long settling or promoting named jobs waits for a row another
#: transaction holds: it waits briefly, and a row it cannot get is left for
#: the sweep. Settles and promotions hold their rows for milliseconds; a
#: longer hold is a caller's transaction (a cancel inside a long atomic()),
#: which must not stall the workers finishing sibling jobs.
BRIEF_LOCK_TIMEOUT = "100ms"


@cache
def skip_locked(name: str) -> str:
    """Return the named statement with its one row lock taken SKIP LOCKED.

    The waiting and the skipping forms are one statement, written once in the
    .sql file (with a plain ``FOR UPDATE``), so they cannot drift apart.
    """
    sql, n = _FOR_UPDATE.subn(r"\g<0> SKIP LOCKED", QUERIES[name])
    if n != 1:  # pragma: no cover - a query edit that breaks the rule
        raise AssertionError(f"{name} must lock with exactly one FOR UPDATE")
    return sql


def wait_briefly(engine: PostgresSupport, work: Callable[[bool], T]) -> T:
    """Run ``work(False)`` waiting at most BRIEF_LOCK_TIMEOUT for each row lock.

    It runs in a savepoint (its own transaction outside one) with a local
    lock timeout, restored afterwards so the caller's transaction keeps its
    own. If a lock times out, everything it did is rolled back and
    ``work(True)`` runs with SKIP LOCKED: what it cannot lock is left to the
    leader's sweep.
    """
    try:
        with transaction.atomic(using=engine.alias):
            row = engine._fetchone("batch_settle.lock_timeout", {"value": BRIEF_LOCK_TIMEOUT})
            assert row is not None
            out = work(False)
            engine._fetchone("batch_settle.lock_timeout_restore", {"value": row[0]})
            return out
    except JobLocked:
        return work(True)


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


def _json_or_none(value: Any, field: str) -> str | None:
    return None if value is None else convert.dump_json(value, field)


class BatchesMixin(PostgresSupport):
    """batch_insert, batch_settle and batch_get."""

    def _batch_insert(self, params: BatchInsertParams) -> JobID:
        """Create a batch expecting ``total`` jobs."""
        total = params.total
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

    def _batch_count_duplicates(self, params: BatchDuplicatesParams) -> BatchDuplicatesResult:
        """Join the waiting duplicates to their batches; count the rest as progress."""
        with db_errors(), self._atomic():
            pairs = list(params.duplicates)
            rows = self._fetchall(
                "batch_count_duplicates",
                {"batch_id": [b for b, _ in pairs], "job_id": [j for _, j in pairs]},
            )
            joined = {r[0] for r in rows}
            rest = [(b, j) for b, j in pairs if j not in joined]
            counted: list[Any] = []
            if rest:
                counted = self._fetchall(
                    "batch_count_duplicates.record",
                    {"batch_id": [b for b, _ in rest], "job_id": [j for _, j in rest]},
                )
        return BatchDuplicatesResult(
            joined=len(joined),
            counted=sum(int(r[1]) for r in counted),
            batches=tuple(sorted(r[0] for r in counted)),
        )

    def _batch_settle(self, params: BatchSettleParams) -> BatchSettleResult:
        """Fold progress and complete batches; insert the callbacks of those completed."""
        result = BatchSettleResult()
        with db_errors(), self._atomic():
            if params.ids is not None:
                values = {"ids": sorted(set(params.ids)), "now": params.now}
                rows = wait_briefly(
                    self,
                    lambda skip: self._fetchall(
                        "batch_settle", values, skip_locked("batch_settle") if skip else None
                    ),
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

    def _batch_get(self, id: JobID) -> BatchRow | None:
        """Return a batch with the progress not yet folded counted in."""
        row = self._fetchone("batch_get", {"id": id})
        return batch_from_row(row) if row else None
