"""Workflow methods of the SQLite engine; SQL in ``queries/workflows.sql``.

SQLite runs one writer at a time, so the transaction that finalizes a job also
records its batch progress and dependency result, promotes or fails its
dependents down the graph and settles its batches: no concurrent finalize can
leave anything for ``workflow_promote_ready`` or ``batch_settle`` to catch up.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any, cast

from django_hopper.engine.params import (
    BatchSettleParams,
    JobInsertResult,
    WorkflowInsertParams,
    WorkflowInsertResult,
    WorkflowPromoteParams,
    WorkflowPromoteResult,
)
from django_hopper.engine.sqlite.batches import (
    BatchesMixin,
    batch_from_row,
    stored_callbacks,
)
from django_hopper.engine.sqlite.convert import _loads, db_time, dumps, inserted_row, job_from_row
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.ids import new_id
from django_hopper.types import (
    CHANNEL_DONE,
    CHANNEL_INSERT,
    Dependency,
    JobEdge,
    JobID,
    JobRow,
    JobState,
    WorkflowRow,
)

#: A finished job for the bookkeeping: [id hex, batch hex, step, state, output JSON text].
Finished = list[Any]


class WorkflowsMixin(SQLiteSupport):
    """workflow_insert, workflow_get and workflow_promote_ready."""

    @translate_errors
    def _workflow_insert(self, params: WorkflowInsertParams) -> WorkflowInsertResult:
        """Insert the batch, jobs and edges in one transaction, after checking everything."""
        now, now_s = self._now(params.now)
        batch_id = params.id or new_id()
        n = len(params.jobs)
        pending = [False] * n
        for d in params.deps:
            pending[d.job] = True
        steps = [s or None for s in params.steps] if params.steps else [None] * n
        rows: list[list[Any]] = []
        results: list[JobInsertResult] = []
        for i, p in enumerate(params.jobs):
            job_id = p.id or new_id()
            sched = p.scheduled_at or now
            sched_s = db_time(sched, "scheduled_at")
            state = (
                JobState.PENDING
                if pending[i]
                else (JobState.SCHEDULED if sched_s > now_s else JobState.AVAILABLE)
            )
            expires = now + p.ttl if p.ttl is not None else None
            tags = list(p.tags)
            args, metadata = dumps(p.args, "args"), dumps(p.metadata, "metadata")
            rows.append(
                [
                    job_id.hex, p.kind, p.queue, state, p.priority, p.max_attempts, sched_s,
                    args, metadata, p.ordering_key,
                    p.partition_key, dumps(tags, "tags"),
                    db_time(expires, "ttl") if expires is not None else None,
                    1 if p.awaited else 0, steps[i], p.subject,
                ]
            )  # fmt: skip
            results.append(
                JobInsertResult(
                    inserted_row(
                        job_id,
                        p,
                        state,
                        sched,
                        now,
                        tags,
                        expires,
                        args,
                        metadata,
                        batch_id=batch_id,
                        step=steps[i],
                    )
                )
            )
        ids = [r[0] for r in rows]
        edges = [
            [ids[d.job], ids[d.depends_on], d.on_failure, 1 if d.reads else 0] for d in params.deps
        ]
        with self._atomic(), self._cursor() as c:
            c.execute(
                Q["batch_insert"],
                {
                    "id": batch_id.hex,
                    "name": params.name,
                    "is_workflow": 1,
                    "total": n,
                    "now": now_s,
                    "metadata": dumps(params.metadata, "metadata"),
                    **stored_callbacks(params.on_success, params.on_failure, params.on_complete),
                },
            )
            c.execute(
                Q["workflow_insert"],
                {"rows": json.dumps(rows), "batch_id": batch_id.hex, "now": now_s},
            )
            if edges:
                c.execute(
                    Q["workflow_insert.edges"],
                    {"edges": json.dumps(edges), "batch_id": batch_id.hex},
                )
        return WorkflowInsertResult(id=batch_id, jobs=results)

    @translate_errors
    def _workflow_get(self, id: JobID) -> WorkflowRow | None:
        """Return the workflow's batch, jobs, edges and step names."""
        with self._atomic(), self._cursor() as c:
            c.execute(Q["workflow_get"], {"id": id.hex})
            row = c.fetchone()
            if row is None:
                return None
            c.execute(Q["workflow_get.jobs"], {"id": id.hex})
            jobs = [job_from_row(r) for r in c.fetchall()]
            c.execute(Q["workflow_get.edges"], {"id": id.hex})
            edges = [
                JobEdge(
                    job=uuid.UUID(r[0]),
                    depends_on=uuid.UUID(r[1]),
                    on_failure=r[2],
                    reads=bool(r[3]),
                )
                for r in c.fetchall()
            ]
        return WorkflowRow(
            batch=batch_from_row(row),
            jobs=jobs,
            edges=edges,
            steps={j.id: j.step for j in jobs if j.step},
        )

    @translate_errors
    def _workflow_promote_ready(self, params: WorkflowPromoteParams) -> WorkflowPromoteResult:
        """Promote (or fail) ready dependents; follow failures down the graph."""
        with self._atomic(), self._cursor() as c:
            return promote(self, c, params)


def promote(engine: SQLiteSupport, c: Any, params: WorkflowPromoteParams) -> WorkflowPromoteResult:
    """Promote or fail ready dependents inside the caller's transaction, cascading."""
    now, now_s = engine._now(params.now)
    at = now.astimezone(dt.UTC).isoformat()
    result = WorkflowPromoteResult()
    depends_on = None if params.depends_on is None else [i.hex for i in params.depends_on]
    after = params.after.hex if params.after is not None else ""
    first = True
    batches: set[str] = set()
    queues: set[str] = set()
    done: list[str] = []
    while first or depends_on:
        c.execute(
            Q["workflow_promote_ready"],
            {
                "depends_on": json.dumps(depends_on) if depends_on is not None else None,
                "after": after,
                "limit": params.limit,
            },
        )
        cands = c.fetchall()
        if first and params.depends_on is None:
            result.scanned = len(cands)
            result.last = uuid.UUID(cands[-1][0]) if cands else None
        first = False
        ready = [r[0] for r in cands if r[1] and r[2] is None]
        fails = [
            [r[0], JobState.CANCELED if r[2] == 1 else JobState.DISCARDED]
            for r in cands
            if r[1] and r[2]
        ]
        if ready:
            c.execute(Q["workflow_promote_ready.promote"], {"ids": json.dumps(ready), "now": now_s})
            queues.update(r[0] for r in c.fetchall())
            result.promoted += len(ready)
        depends_on = None
        if fails:
            fails_s = json.dumps(fails)
            c.execute(
                Q["workflow_promote_ready.archive"], {"fails": fails_s, "now": now_s, "at": at}
            )
            c.execute(Q["workflow_promote_ready.delete"], {"fails": fails_s})
            state = dict((f[0], f[1]) for f in fails)
            finished = []
            for job_hex, batch_hex, step, awaited in c.fetchall():
                finished.append([job_hex, batch_hex, step, state[job_hex], None])
                if batch_hex:
                    batches.add(batch_hex)
                if awaited:
                    done.append(str(uuid.UUID(job_hex)))
            record(c, finished, now_s)
            result.failed += len(finished)
            depends_on = [f[0] for f in finished] or None
    result.batches = sorted(uuid.UUID(b) for b in batches)
    if queues:
        engine.notify(CHANNEL_INSERT, sorted(queues))
    if done:
        engine.notify(CHANNEL_DONE, done)
    return result


def record(c: Any, finished: Sequence[Finished], now_s: str) -> None:
    """Record finished workflow jobs' batch progress and dependency results."""
    rows = [f for f in finished if f[1] is not None]
    if not rows:
        return
    args = {"finished": json.dumps(rows), "now": now_s}
    c.execute(Q["workflow_promote_ready.progress"], args)
    c.execute(Q["workflow_promote_ready.results"], args)


def jobs_finished(
    engine: SQLiteSupport, c: Any, finished: Sequence[Finished], now: dt.datetime | None
) -> None:
    """Do, in the finalizing transaction, everything a batch job's finish entails:
    record progress and results, promote or fail dependents, settle the batches."""
    rows = [f for f in finished if f[1] is not None]
    if not rows:
        return
    _, now_s = engine._now(now)
    record(c, rows, now_s)
    promoted = promote(
        engine, c, WorkflowPromoteParams(depends_on=tuple(uuid.UUID(f[0]) for f in rows), now=now)
    )
    batches = {uuid.UUID(f[1]) for f in rows} | set(promoted.batches)
    cast(BatchesMixin, engine)._settle(c, BatchSettleParams(ids=tuple(sorted(batches)), now=now))


def finished_of(jobs: Sequence[JobRow]) -> list[Finished]:
    """Return the bookkeeping rows of finished (or deleted) jobs that belong to a batch."""
    return [
        [j.id.hex, j.batch_id.hex, j.step, j.state, None] for j in jobs if j.batch_id is not None
    ]


def attach_dependencies(engine: SQLiteSupport, jobs: list[JobRow]) -> list[JobRow]:
    """Give claimed workflow jobs the dependencies they read: one extra query, and
    only when a claimed job belongs to a batch, never on the plain path."""
    ids = [j.id.hex for j in jobs if j.batch_id is not None]
    if not ids:
        return jobs
    by_job: dict[str, list[Dependency]] = {}
    with engine._cursor() as c:
        c.execute(Q["job_claim.dependencies"], {"ids": json.dumps(ids)})
        for job_hex, dep_hex, step, state, output in c.fetchall():
            by_job.setdefault(job_hex, []).append(
                Dependency(
                    id=uuid.UUID(dep_hex),
                    step=step,
                    state=state,
                    output=_loads(output) if output is not None else None,
                )
            )
    for j in jobs:
        deps = by_job.get(j.id.hex)
        if deps is not None:
            j.dependencies = deps
    return jobs
