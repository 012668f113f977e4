"""The engine's rules that need no database, written once for both engines.

What a valid workflow is, how a batch's callbacks are stored and chosen, how
hopper ends an attempt whose holder stopped reporting. The rules that need
atomicity live inside single SQL statements.
"""

from __future__ import annotations

import datetime as dt
import json
import pkgutil
import re
from collections.abc import Sequence
from functools import cache

from django_hopper import migrations as hopper_migrations
from django_hopper.engine.params import (
    JobFinalize,
    JobInsertParams,
    JobsMaintainParams,
    SchemaState,
    WorkflowInsertParams,
)
from django_hopper.exceptions import (
    InvalidJob,
    SchemaMismatch,
)
from django_hopper.types import (
    JSON,
    LEASE_EXPIRED_ERROR,
    AttemptError,
    DependencyFailure,
    JobID,
    JobRow,
    JobState,
    JobStepRow,
    RescueReason,
)


def validate_workflow(params: WorkflowInsertParams) -> None:
    """Refuse an invalid workflow with an InvalidJob naming the problem.

    Written once for both engines, and run before anything is written.
    """

    n = len(params.jobs)
    if not isinstance(params.name, str) or not params.name or len(params.name) > 255:
        raise InvalidJob(
            f"a workflow's name must be a non-empty string of at most 255 characters, "
            f"not {params.name!r}",
            field="name",
        )
    if n == 0:
        raise InvalidJob("a workflow needs at least one job", field="jobs")
    for i, p in enumerate(params.jobs):
        if p.unique_key is not None:
            raise InvalidJob(
                f"jobs[{i}] ({p.kind}) has a unique key; workflow jobs cannot have one, "
                "since a skipped duplicate would leave its dependents waiting forever",
                field="unique_key",
            )
        if p.batch_id is not None:
            raise InvalidJob(
                f"jobs[{i}] ({p.kind}) has a batch_id; the workflow is its batch",
                field="batch_id",
            )
    if params.steps:
        if len(params.steps) != n:
            raise InvalidJob(
                f"steps names {len(params.steps)} jobs but the workflow has {n}", field="steps"
            )
        seen: dict[str, int] = {}
        for i, step in enumerate(params.steps):
            if not isinstance(step, str) or len(step) > 255:
                raise InvalidJob(f"steps[{i}] must be a string, not {step!r}", field="steps")
            if step and step in seen:
                raise InvalidJob(
                    f"step name {step!r} is used twice (jobs[{seen[step]}] and jobs[{i}])",
                    field="steps",
                )
            seen[step] = i
    edges: set[tuple[int, int]] = set()
    after: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for k, d in enumerate(params.deps):
        for name in ("job", "depends_on"):
            v = getattr(d, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
                raise InvalidJob(
                    f"deps[{k}].{name} is {v!r}: an edge must join two jobs of the workflow "
                    f"(indexes 0..{n - 1})",
                    field="deps",
                )
        if d.job == d.depends_on:
            raise InvalidJob(f"deps[{k}]: jobs[{d.job}] cannot depend on itself", field="deps")
        if d.on_failure not in DependencyFailure.values():
            raise InvalidJob(
                f"deps[{k}].on_failure must be one of {', '.join(DependencyFailure.values())}, "
                f"not {d.on_failure!r}",
                field="on_failure",
            )
        if (d.job, d.depends_on) in edges:
            raise InvalidJob(
                f"deps[{k}]: jobs[{d.job}] depends on jobs[{d.depends_on}] twice", field="deps"
            )
        edges.add((d.job, d.depends_on))
        after[d.depends_on].append(d.job)
        indegree[d.job] += 1
    # Kahn's algorithm: whatever is left unvisited sits on a cycle.
    ready = [i for i in range(n) if indegree[i] == 0]
    visited = 0
    while ready:
        i = ready.pop()
        visited += 1
        for j in after[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if visited != n:
        names = params.steps or [""] * n
        cycle = [names[i] or f"jobs[{i}]" for i in range(n) if indegree[i] > 0]
        raise InvalidJob(
            f"the workflow's dependencies form a cycle through {', '.join(cycle[:10])}",
            field="deps",
        )


def callback_to_json(p: JobInsertParams | None) -> JSON:
    """Store a callback job's params as JSON (written once for both engines)."""
    if p is None:
        return None
    return {
        "kind": p.kind,
        "queue": p.queue,
        "priority": p.priority,
        "max_attempts": p.max_attempts,
        "args": p.args,
        "metadata": p.metadata,
        "tags": list(p.tags),
        "unique_key": p.unique_key,
        "unique_finished": list(p.unique_finished),
        "ordering_key": p.ordering_key,
        "partition_key": p.partition_key,
        "ttl": p.ttl.total_seconds() if p.ttl else None,
        "awaited": p.awaited,
    }


def callbacks_of(batch_id: JobID, failed: int, stored: Sequence[JSON]) -> list[JobInsertParams]:
    """Return the callback jobs a batch inserts on completion.

    ``stored`` is (on_success, on_failure, on_complete) as callback_to_json
    made them: on_success if no job failed, on_failure otherwise, on_complete
    either way; each one's metadata gains ``batch_id``.
    """
    on_success, on_failure, on_complete = stored
    chosen = [on_failure if failed else on_success, on_complete]
    out: list[JobInsertParams] = []
    for obj in chosen:
        if isinstance(obj, str):
            obj = json.loads(obj)
        if not obj:
            continue
        meta = dict(obj.get("metadata") or {})
        meta["batch_id"] = str(batch_id)
        ttl = obj.get("ttl")
        out.append(
            JobInsertParams(
                kind=obj["kind"],
                queue=obj.get("queue") or "default",
                priority=int(obj.get("priority") or 0),
                max_attempts=int(obj.get("max_attempts") or 25),
                args=obj.get("args") if obj.get("args") is not None else {},
                metadata=meta,
                tags=tuple(obj.get("tags") or ()),
                unique_key=obj.get("unique_key"),
                unique_finished=tuple(obj.get("unique_finished") or ()),
                ordering_key=obj.get("ordering_key"),
                partition_key=obj.get("partition_key"),
                ttl=dt.timedelta(seconds=ttl) if ttl else None,
                awaited=bool(obj.get("awaited")),
            )
        )
    return out


def rescued_state(job: JobRow) -> str:
    """Return how hopper ends an attempt it takes from a holder that stopped reporting.

    Canceled if a cancel was requested, discarded on the last attempt, retryable
    otherwise: the one rule for the rescuer and for lease expiry.
    """
    if job.cancel_requested_at is not None:
        return JobState.CANCELED
    if job.attempt >= job.max_attempts:
        return JobState.DISCARDED
    return JobState.RETRYABLE


def attempt_error(
    job: JobRow, error: str, *, rescue: str = "", trace: str = "", by: int | None = None
) -> AttemptError:
    """Return the error entry that ends an attempt of ``job``, fenced to its claim.

    ``at`` is left for the engine to set from database time; ``by`` is the
    client whose attempt it was (None when no claimed attempt ran).
    """
    return AttemptError(
        at=None,
        attempt=job.attempt,
        error=error,
        fence=job.fence,
        trace=trace,
        rescue=rescue,
        by=by,
    )


def lease_expiry_result(job: JobRow, token: JobID) -> JobFinalize:
    """Return how an expired lease ends ``job``'s attempt: the rule, written once.

    Canceled if a cancel was requested, else discarded on the last attempt,
    else retryable at once (the holder is gone; a backoff would only delay the
    takeover). Fenced to the lease, so a holder that finishes first wins.
    """
    err = attempt_error(job, LEASE_EXPIRED_ERROR, rescue=RescueReason.LEASE_EXPIRED)
    return _lease_ended(job, token, err)


def _lease_ended(job: JobRow, token: JobID, err: AttemptError) -> JobFinalize:
    """Return how an expired lease ends the attempt: the rescued state, fenced to
    the lease ``token`` rather than a client."""
    return JobFinalize(
        id=job.id,
        attempted_by=None,
        fence=job.fence,
        state=rescued_state(job),
        error=err,
        lease_token=token,
    )


def step_from_row(
    job_id: JobID,
    step: str,
    result: JSON,
    attempts: int,
    last_error: str | None,
    recorded_at: dt.datetime | None,
) -> JobStepRow:
    """Build a step row from the stored columns: ``result`` is ``{"value": ...}`` once done."""
    done = result is not None
    return JobStepRow(
        job_id=job_id,
        step=step,
        done=done,
        result=result.get("value") if done and isinstance(result, dict) else None,
        attempts=int(attempts or 0),
        last_error=last_error,
        recorded_at=recorded_at,
    )


# -- pass leases of resumable runs ---------------------------------------------

#: The error of a begun pass that a later claim took over: its lease expired, or
#: the worker holding it stopped renewing its own lease (its process is gone).
PASS_LEASE_EXPIRED_ERROR = (
    "interrupted: the pass holding this run stopped reporting (its lease expired, "
    "or its worker's did)"
)
#: The start of the error of a run failed for missing its admission too many times.
LEASE_TOO_SHORT_ERROR = "lease too short for this environment"
#: The snooze reason of a run waiting after an admission miss.
ADMISSION_MISS_REASON = "resumable: admission miss"
#: The snooze reason of a job claimed ahead of a free slot whose worker stopped reporting.
AHEAD_MISS_REASON = "claimed ahead: admission miss"
#: The start of the error of a job discarded for losing too many claims made ahead of a slot.
AHEAD_LOST_ERROR = "claimed ahead and lost too often"
#: The wait after a first admission miss; it doubles per consecutive miss, up to the max.
ADMISSION_BACKOFF_BASE = dt.timedelta(seconds=1)
ADMISSION_BACKOFF_MAX = dt.timedelta(minutes=5)


def admission_backoff(misses: int) -> dt.timedelta:
    """Return how long a run waits after its ``misses``-th consecutive admission miss.

    Doubling keeps a run whose lease is too short for where it runs from being
    claimed and released in a tight loop, while a one-off slow reply costs a second.
    """
    if misses <= 1:
        return ADMISSION_BACKOFF_BASE
    return min(ADMISSION_BACKOFF_BASE * 2 ** min(misses - 1, 20), ADMISSION_BACKOFF_MAX)


def admission_miss_result(
    job: JobRow,
    misses: int,
    max_misses: int,
    reason: str,
    token: JobID | None,
    *,
    ahead: bool = False,
) -> JobFinalize:
    """Return how an admission miss ends ``job``'s claim: the rule, written once.

    No handler ran, so the attempt is given back (a snooze) and the run waits
    :func:`admission_backoff`; at ``max_misses`` consecutive misses it is
    discarded with :data:`LEASE_TOO_SHORT_ERROR` and ``reason``, since a run
    that can never begin would otherwise be claimed and released forever with
    nothing reporting it. A requested cancel cancels it. Fenced to the claim
    (the lease ``token``, or the client).

    ``ahead``: the claim was one a worker made ahead of a free slot and lost
    (its worker stopped reporting), so nothing tells whether the job started;
    it is counted the same way, in the words of :data:`AHEAD_MISS_REASON` and
    :data:`AHEAD_LOST_ERROR`, so that a job that kills its workers still ends.
    """
    by = None if token is not None else job.attempted_by
    if job.cancel_requested_at is not None or misses >= max_misses:
        canceled = job.cancel_requested_at is not None
        if canceled:
            error = "canceled before it started" if ahead else "canceled before its pass began"
        elif ahead:
            error = (
                f"{AHEAD_LOST_ERROR}: {misses} consecutive claims ahead of a free slot "
                f"ended with their worker gone (the last: {reason})"
            )
        else:
            error = (
                f"{LEASE_TOO_SHORT_ERROR}: {misses} consecutive claims did not begin "
                f"their pass (the last: {reason})"
            )
        err = attempt_error(
            job,
            error,
            rescue=RescueReason.CANCELED if canceled else RescueReason.ADMISSION_MISSED,
            by=job.attempted_by,
        )
        return JobFinalize(
            id=job.id,
            attempted_by=by,
            fence=job.fence,
            state=JobState.CANCELED if canceled else JobState.DISCARDED,
            error=err,
            lease_token=token,
        )
    return JobFinalize(
        id=job.id,
        attempted_by=by,
        fence=job.fence,
        state=JobState.SCHEDULED,
        delay=admission_backoff(misses),
        snooze=True,
        snooze_reason=(
            f"{AHEAD_MISS_REASON if ahead else ADMISSION_MISS_REASON} "
            f"{misses}/{max_misses}: {reason}"
        ),
        lease_token=token,
    )


def pass_takeover_result(
    job: JobRow, token: JobID, began: bool, misses: int, max_misses: int
) -> JobFinalize:
    """Return how a takeover ends a run whose pass lease expired.

    A pass that had BEGUN started and never reported (a crash between BEGIN
    and the handler included, which nothing can tell from a crash inside it),
    so it is charged as a failed attempt, as any expired lease is. A claim that
    never began ran nothing: an admission miss, not charged.
    """
    if not began:
        return admission_miss_result(
            job, misses, max_misses, "its lease expired before the pass began", token
        )
    err = attempt_error(
        job, PASS_LEASE_EXPIRED_ERROR, rescue=RescueReason.LEASE_EXPIRED, by=job.attempted_by
    )
    return _lease_ended(job, token, err)


# -- the schema version ---------------------------------------------------------------

_NUMBERED = re.compile(r"^(\d+)_")


@cache
def code_version() -> int:
    """Return the number of the newest hopper migration this code ships."""
    numbers = [
        int(m.group(1))
        for module in pkgutil.iter_modules(hopper_migrations.__path__)
        if (m := _NUMBERED.match(module.name))
    ]
    return max(numbers, default=0)


def _migrate_command(alias: str) -> str:
    database = "" if alias == "default" else f" --database {alias}"
    return f"manage.py migrate django_hopper{database}"


def schema_mismatch(state: SchemaState, code: int, alias: str) -> None:
    """Refuse a schema that does not go with code built for schema ``code``.

    Raise :class:`~django_hopper.exceptions.SchemaMismatch` with a message
    naming the database's version, the code's, and what to do.
    """
    if state.version == 0:
        raise SchemaMismatch(
            f"database {alias!r} has no hopper schema (this code is built for schema "
            f"{code}): run `{_migrate_command(alias)}`",
            database=0,
            code=code,
        )
    if state.version < code:
        raise SchemaMismatch(
            f"database {alias!r} has hopper schema {state.version}, but this code is built "
            f"for schema {code}: run `{_migrate_command(alias)}` before starting workers",
            database=state.version,
            code=code,
        )
    if state.oldest_code > code:
        raise SchemaMismatch(
            f"database {alias!r} has hopper schema {state.version}, which no longer serves "
            f"code built for schema {code} (it needs code built for schema "
            f"{state.oldest_code} or later): deploy the newer code; "
            f"`{_migrate_command(alias)}` does not apply to older code",
            database=state.version,
            code=code,
        )


# -- live-table upkeep ---------------------------------------------------------

#: The hot tables upkeep keeps (the live job table first).
HOT_TABLES = ("hopper_job", "hopper_job_dependency", "hopper_batch_progress")


def stale_statistics(live: int, changed: int, estimate: int, params: JobsMaintainParams) -> bool:
    """Whether a table's planner statistics are stale.

    ``live`` is the table's rows now, ``estimate`` the rows its statistics
    hold (-1: never analyzed), ``changed`` the rows changed since the last
    analyze. Stale when enough rows changed, or when the estimate is off by
    ``analyze_ratio`` either way (or was never taken) while the table holds
    at least ``analyze_min_rows``. An analyze brings ``estimate`` to ``live``
    and ``changed`` to 0, so the rule does not ask for another until the
    table changes that much again: an engine whose ANALYZE reads the whole
    table pays for it once per ``analyze_ratio``-fold change, never per pass.

    A table that shrank below ``analyze_min_rows`` (a drained queue) keeps
    the statistics of its larger self: an analysis of a nearly empty table
    tells the planner it holds a row or none (SQLite then writes zero counts),
    and the plans made from that scan once the table fills again, until the
    next analysis. Plans made for too many rows stay index plans.
    """
    if changed >= params.analyze_changes:
        return True
    if live < params.analyze_min_rows:
        return False
    return estimate < 0 or max(live, estimate) / max(min(live, estimate), 1) >= params.analyze_ratio


def upkeep_action(
    dead: int, live: int, changed: int, estimate: int, params: JobsMaintainParams
) -> str | None:
    """Decide what a hot table needs: "vacuum", "analyze" or nothing.

    Vacuum once enough dead tuples piled up (the claim walks past their index
    entries). Analyze when its statistics are stale (``stale_statistics``) —
    and then vacuum too if a table's worth of dead tuples is there:
    statistics taken over a drained queue full of dead entries make the
    planner leave the claim index for a scan over them.
    """
    if dead >= params.vacuum_dead_tuples:
        return "vacuum"
    if not stale_statistics(live, changed, estimate, params):
        return None
    return "vacuum" if dead >= params.analyze_min_rows else "analyze"
