"""Workflow methods of the PostgreSQL engine; SQL in ``queries/workflows.sql``.

The statement that finalizes a job records its batch progress and dependency
result and promotes the dependents it can see are ready; two dependencies
finalized by concurrent transactions each see the other still live, so the
client that finalized them calls ``workflow_promote_ready`` afterwards, and the
leader sweeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from django_hopper.engine.params import (
    BatchSettleParams,
    JobInsertResult,
    WorkflowInsertParams,
    WorkflowInsertResult,
    WorkflowPromoteParams,
    WorkflowPromoteResult,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.batches import (
    batch_from_row,
    skip_locked,
    wait_briefly,
)
from django_hopper.engine.postgres.convert import job_from_row
from django_hopper.engine.postgres.support import PostgresSupport, db_errors
from django_hopper.engine.rules import callback_to_json
from django_hopper.exceptions import DatabaseError
from django_hopper.ids import new_id
from django_hopper.types import (
    CHANNEL_DONE,
    CHANNEL_INSERT,
    Dependency,
    JobEdge,
    JobID,
    JobRow,
    WorkflowRow,
)


class WorkflowsMixin(PostgresSupport):
    """workflow_insert, workflow_get, workflow_promote_ready, and the workflow
    bookkeeping of the job methods (claim, cancel, delete, expiry)."""

    def _workflow_insert(self, params: WorkflowInsertParams) -> WorkflowInsertResult:
        """Insert the batch, jobs and edges in one statement, after checking everything."""
        batch_id = params.id or new_id()
        ids = convert.job_ids(params.jobs)
        arrays = convert.insert_arrays(params.jobs, ids)
        has_deps = [False] * len(ids)
        for d in params.deps:
            has_deps[d.job] = True
        steps = [s or None for s in params.steps] if params.steps else [None] * len(ids)
        values = {
            **{k: v for k, v in arrays.items() if k not in ("unique_key", "batch_id")},
            "step": steps,
            "pending": has_deps,
            "batch_id": batch_id,
            "name": params.name,
            "total": len(ids),
            "batch_metadata": convert.dump_json(params.metadata, "metadata"),
            "on_success": _dump(callback_to_json(params.on_success), "on_success"),
            "on_failure": _dump(callback_to_json(params.on_failure), "on_failure"),
            "on_complete": _dump(callback_to_json(params.on_complete), "on_complete"),
            "edge_job": [ids[d.job] for d in params.deps],
            "edge_depends_on": [ids[d.depends_on] for d in params.deps],
            "edge_on_failure": [d.on_failure for d in params.deps],
            "edge_reads": [bool(d.reads) for d in params.deps],
            "now": params.now,
        }
        with db_errors(), self._atomic():
            rows = self._fetchall("workflow_insert", values)
            if len(rows) != len(ids):  # pragma: no cover - no unique keys, no conflict
                raise DatabaseError(f"inserted {len(rows)} of {len(ids)} workflow jobs")
            by_id = {row[0]: row for row in rows}
            results = []
            for i, (p, job_id) in enumerate(zip(params.jobs, ids, strict=True)):
                job = convert.inserted_job(p, arrays, i, by_id[job_id])
                job.batch_id = batch_id
                job.step = steps[i]
                results.append(JobInsertResult(job))
        return WorkflowInsertResult(id=batch_id, jobs=results)

    def _workflow_get(self, id: JobID) -> WorkflowRow | None:
        """Return the workflow's batch, jobs, edges and step names (one snapshot)."""
        with db_errors(), self._atomic():
            row = self._fetchone("workflow_get", {"id": id})
            if row is None:
                return None
            jobs = [job_from_row(r) for r in self._fetchall("workflow_get.jobs", {"id": id})]
            edges = [
                JobEdge(job=r[0], depends_on=r[1], on_failure=r[2], reads=bool(r[3]))
                for r in self._fetchall("workflow_get.edges", {"id": id})
            ]
        return WorkflowRow(
            batch=batch_from_row(row),
            jobs=jobs,
            edges=edges,
            steps={j.id: j.step for j in jobs if j.step},
        )

    def _workflow_promote_ready(self, params: WorkflowPromoteParams) -> WorkflowPromoteResult:
        """Promote (or fail) ready dependents; follow failures down the graph."""
        with db_errors(), self._atomic():
            if params.depends_on is None:
                return self._promote(params, skip=True)
            return wait_briefly(self, lambda skip: self._promote(params, skip=skip))

    def _promote(self, params: WorkflowPromoteParams, *, skip: bool) -> WorkflowPromoteResult:
        """Run the promotion and its cascade, skipping locked candidates with ``skip``."""
        result = WorkflowPromoteResult()
        depends_on = None if params.depends_on is None else list(params.depends_on)
        batches: set[JobID] = set()
        first = True
        sql = skip_locked("workflow_promote_ready") if skip else None
        while first or depends_on:
            row = self._fetchone(
                "workflow_promote_ready",
                {
                    "depends_on": depends_on,
                    "after": params.after if first else None,
                    "limit": params.limit,
                    "now": params.now,
                    "insert_channel": CHANNEL_INSERT,
                    "done_channel": CHANNEL_DONE,
                },
                sql,
            )
            assert row is not None
            promoted, scanned, last, gone, gone_batches, _ = row
            result.promoted += int(promoted)
            result.failed += len(gone)
            if first and params.depends_on is None:
                result.scanned, result.last = int(scanned), last
            batches.update(gone_batches)
            first = False
            # A failed job's own dependents are next (the cascade).
            depends_on = list(gone) or None
        result.batches = sorted(batches)
        return result


def _dump(value: object, field: str) -> str | None:
    return None if value is None else convert.dump_json(value, field)


# -- bookkeeping for the job methods (JobsMixin calls these) -----------------


def jobs_finished(engine: PostgresSupport, jobs: Sequence[JobRow]) -> None:
    """Count waiting jobs a cancel, delete or expiry took out toward their batches,
    and promote or fail their dependents, in the caller's transaction.

    Called only for jobs that were live: a finished job was counted when it finished.
    """
    done = [j for j in jobs if j.batch_id is not None]
    if not done:
        return
    wf = cast(WorkflowsMixin, engine)
    engine._execute(
        "workflow_promote_ready.record",
        {
            "id": [j.id for j in done],
            "batch_id": [j.batch_id for j in done],
            "step": [j.step for j in done],
            "state": [j.state for j in done],
            "now": None,
        },
    )
    promoted = wf.workflow_promote_ready(
        WorkflowPromoteParams(depends_on=tuple(j.id for j in done))
    )
    batches = {j.batch_id for j in done if j.batch_id is not None} | set(promoted.batches)
    wf.batch_settle(BatchSettleParams(ids=tuple(sorted(batches))))


def attach_dependencies(engine: PostgresSupport, jobs: list[JobRow]) -> list[JobRow]:
    """Give claimed workflow jobs the dependencies they read: one extra query, and
    only when a claimed job belongs to a batch, never on the plain path."""
    ids = [j.id for j in jobs if j.batch_id is not None]
    if not ids:
        return jobs
    by_job: dict[JobID, list[Dependency]] = {}
    for job_id, dep_id, step, state, output in engine._fetchall(
        "job_claim.dependencies", {"ids": ids}
    ):
        by_job.setdefault(job_id, []).append(
            Dependency(id=dep_id, step=step, state=state, output=convert.load_json(output))
        )
    for j in jobs:
        if j.id in by_job:
            j.dependencies = by_job[j.id]
    return jobs
