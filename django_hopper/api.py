"""Operator functions on jobs: read, cancel, retry, delete (one or many), list, logs.

These are the functions the admin actions, the management commands and user
code call, so that each rule (what a retry of a discarded job does, what a
cancel of a running job does) is written once, in the engine. Each takes a
job ID as a ``uuid.UUID`` or its string form and runs on the Django
connection of the database alias the job lives on, so it joins the caller's
transaction on that alias.

Where jobs live follows the topology (``HOPPER["QUEUE_DATABASES"]``, see
:mod:`django_hopper.topology`): with queues on several aliases, a function
given only an ID looks for the job on each alias in turn, ``DATABASE`` first
(a job ID is a UUIDv7 made by hopper: one alias holds it), and acts there;
``using=`` names the alias and skips the search. Listings read every alias
(or the alias of ``queue``, or ``using``) and merge the pages by ID. With one
alias (the usual case) nothing is searched: every call is one engine call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_hopper import signals, topology, validation
from django_hopper.engine import checks, get_engine
from django_hopper.engine.params import (
    JobCancelManyParams,
    JobCancelParams,
    JobDeleteManyParams,
    JobDeleteParams,
    JobListParams,
    JobRetryManyParams,
    JobRetryParams,
    SubjectEraseParams,
)
from django_hopper.exceptions import InvalidJob, NotFound
from django_hopper.types import ErasureRow, JobOutcome, JobState

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import AttemptLog, JobManyResult, JobRow

__all__ = [
    "cancel_job",
    "cancel_jobs",
    "delete_job",
    "delete_jobs",
    "erase_subject",
    "get_job",
    "job_logs",
    "list_jobs",
    "parse_job_id",
    "retry_job",
    "retry_jobs",
    "subject_erasures",
]


def parse_job_id(value: Any, field: str = "job_id") -> uuid.UUID:
    """Return a job ID as a UUID; raise InvalidJob naming ``field`` if it is not one."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value.strip())
        except ValueError:
            pass
    raise InvalidJob(f"{field} must be a UUID, not {value!r}", field=field)


def _aliases(using: str | None) -> list[str]:
    """Return the aliases to act on: ``using`` (checked), else every alias jobs live on."""
    known = topology.aliases()
    if using is None:
        return known
    if using not in known:
        raise InvalidJob(
            f"using must be an alias hopper's jobs live on ({', '.join(known)}), not {using!r}",
            field="using",
        )
    return [using]


def _find(jid: uuid.UUID, using: str | None) -> tuple[BaseEngine, JobRow | None]:
    """Return the engine of the alias holding the job and the job (None: on no alias).

    One read per alias tried, ``DATABASE`` first; not found anywhere, the
    engine of the first alias is returned so that its call raises NotFound.
    """
    aliases = _aliases(using)
    for alias in aliases:
        engine = get_engine(alias)
        row = engine.job_get(jid)
        if row is not None:
            return engine, row
    return get_engine(aliases[0]), None


def _engine_of(jid: uuid.UUID, using: str | None) -> BaseEngine:
    """Return the engine of the alias holding the job, searching only with several aliases."""
    aliases = _aliases(using)
    if len(aliases) == 1:
        return get_engine(aliases[0])
    return _find(jid, using)[0]


def get_job(job_id: uuid.UUID | str, *, using: str | None = None) -> JobRow:
    """Return a job, live or from history, from the alias holding it; raise NotFound if none."""
    jid = parse_job_id(job_id)
    row = _find(jid, using)[1]
    if row is None:
        raise NotFound(f"job {jid} does not exist")
    return row


def cancel_job(job_id: uuid.UUID | str, *, using: str | None = None) -> JobRow:
    """Cancel a job and return it as it is afterwards.

    A waiting job moves to history as canceled at once. A running job gets a
    cancel request that its worker acts on (the job is still ``running`` in
    the returned row, with ``cancel_requested_at`` set). A finished job is
    returned unchanged. Raises NotFound for an unknown job.
    """

    jid = parse_job_id(job_id)
    engine, before = _find(jid, using)
    row = engine.job_cancel(JobCancelParams(id=jid))
    if before is not None and before.state in _WAITING and row.state == JobState.CANCELED:
        _announce_ending(row, engine.alias)
    return row


#: States in which a cancel ends the job at once (no attempt runs).
_WAITING = frozenset({JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE, JobState.PENDING})


def _announce_ending(row: JobRow, alias: str) -> None:
    """Send ``jobs_ended`` for a job this call ended, once the ending commits.

    A cancel of a waiting job ends it without an attempt, so no worker
    announces it (the Django Tasks backend turns this into
    ``task_finished``). The signal waits for the caller's transaction: a
    rolled-back cancel ended nothing.
    """

    if not signals.jobs_ended.receivers:
        return

    transaction.on_commit(lambda: signals.send_logged(signals.jobs_ended, jobs=[row]), using=alias)


def _announce_endings(rows: list[JobRow], alias: str) -> None:
    """Send ``jobs_ended`` once for jobs a bulk cancel ended, once the cancel commits."""

    if not signals.jobs_ended.receivers:
        return

    transaction.on_commit(lambda: signals.send_logged(signals.jobs_ended, jobs=rows), using=alias)


def retry_job(
    job_id: uuid.UUID | str, *, from_start: bool = False, using: str | None = None
) -> JobRow:
    """Make a job available to run now, and return it.

    A finished job (canceled, discarded or completed) moves back to the live
    table, with one more attempt if it had used them all; a waiting job runs
    now instead of at its scheduled time. ``from_start`` forgets the job's
    recorded progress. Raises JobRunning for a running job, UniqueConflict if
    a live job holds its unique key, NotFound for an unknown job.
    """

    if not isinstance(from_start, bool):
        raise InvalidJob(
            f"from_start must be True or False, not {from_start!r}", field="from_start"
        )
    jid = parse_job_id(job_id)
    return _engine_of(jid, using).job_retry(JobRetryParams(id=jid, from_start=from_start))


def delete_job(job_id: uuid.UUID | str, *, using: str | None = None) -> JobRow:
    """Delete a job that is not running (live or history) and its logs; return it as it was.

    Raises JobRunning for a running job (cancel it instead), NotFound for an
    unknown job.
    """

    jid = parse_job_id(job_id)
    return _engine_of(jid, using).job_delete(JobDeleteParams(id=jid))


def _ids(job_ids: Iterable[uuid.UUID | str]) -> list[uuid.UUID]:
    """Parse many job IDs, naming the bad one."""
    if isinstance(job_ids, str | uuid.UUID):
        raise InvalidJob("job_ids must be a list of job IDs, not one ID", field="job_ids")
    return [parse_job_id(i, "job_ids") for i in job_ids]


def _many(
    ids: list[uuid.UUID],
    using: str | None,
    call: Callable[[BaseEngine, list[uuid.UUID]], JobManyResult],
) -> JobManyResult:
    """Run a set-based call on each alias in turn with the IDs not found so far; merge.

    One statement per alias (one in all with one alias); each alias's part
    commits on its own connection (there is no transaction across databases).
    """
    aliases = _aliases(using)
    result = call(get_engine(aliases[0]), ids)
    for alias in aliases[1:]:
        missing = result.ids(JobOutcome.NOT_FOUND)
        if not missing:
            break
        found = call(get_engine(alias), missing)
        result.outcomes.update(
            (i, o) for i, o in found.outcomes.items() if o != JobOutcome.NOT_FOUND
        )
        result.jobs.extend(found.jobs)
    return result


def cancel_jobs(job_ids: Iterable[uuid.UUID | str], *, using: str | None = None) -> JobManyResult:
    """Cancel many jobs at once, each as :func:`cancel_job` would; return what happened to each.

    One engine statement for the set (per alias), not a call per job. The
    result maps every ID to a ``JobOutcome``: canceled, cancel_requested
    (running), finished (nothing to cancel) or not_found.
    """

    def cancel(engine: BaseEngine, ids: list[uuid.UUID]) -> JobManyResult:
        result = engine.job_cancel_many(JobCancelManyParams(ids=ids))
        ended = [j for j in result.jobs if j.state == JobState.CANCELED]
        if ended:
            _announce_endings(ended, engine.alias)
        return result

    return _many(_ids(job_ids), using, cancel)


def retry_jobs(
    job_ids: Iterable[uuid.UUID | str], *, from_start: bool = False, using: str | None = None
) -> JobManyResult:
    """Retry many jobs at once, each as :func:`retry_job` would; return what happened to each.

    What ``retry_job`` raises becomes the job's outcome (running,
    unique_conflict, not_found) and leaves that job unchanged; the others are
    retried.
    """

    if not isinstance(from_start, bool):
        raise InvalidJob(
            f"from_start must be True or False, not {from_start!r}", field="from_start"
        )
    return _many(
        _ids(job_ids),
        using,
        lambda engine, ids: engine.job_retry_many(
            JobRetryManyParams(ids=ids, from_start=from_start)
        ),
    )


def delete_jobs(job_ids: Iterable[uuid.UUID | str], *, using: str | None = None) -> JobManyResult:
    """Delete many jobs at once, each as :func:`delete_job` would; running ones are refused."""

    return _many(
        _ids(job_ids),
        using,
        lambda engine, ids: engine.job_delete_many(JobDeleteManyParams(ids=ids)),
    )


def job_logs(job_id: uuid.UUID | str, *, using: str | None = None) -> list[AttemptLog]:
    """Return the log lines of a job's attempts, oldest attempt first."""
    jid = parse_job_id(job_id)
    return _engine_of(jid, using).job_logs(jid)


def _strings(value: str | Iterable[str] | None, field: str) -> tuple[str, ...]:
    """Accept one string or several, so ``state="running"`` reads naturally."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    out = tuple(value)
    if not all(isinstance(v, str) and v for v in out):
        raise InvalidJob(f"{field} must be strings, not {value!r}", field=field)
    return out


def list_jobs(
    *,
    queue: str | None = None,
    kinds: str | Iterable[str] | None = None,
    states: str | Iterable[str] | None = None,
    ordering_key: str | None = None,
    newest_first: bool = False,
    after: uuid.UUID | str | None = None,
    limit: int = 100,
    ids: Iterable[uuid.UUID | str] | None = None,
    priorities: Iterable[int] | None = None,
    tags_any: str | Iterable[str] | None = None,
    tags_all: str | Iterable[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    using: str | None = None,
) -> list[JobRow]:
    """Return live and history jobs matching every filter given, in ID (creation) order.

    ``after`` is the cursor of the next page: pass the last ID of a page.
    ``metadata`` keeps jobs whose metadata contains the given object.
    ``ordering_key`` needs ``queue`` (a key is a lane within its queue).
    With queues on several aliases the page covers every alias (``limit``
    rows from each, merged by ID and cut to ``limit``: IDs are ordered across
    aliases, so ``after`` pages through all of them); ``queue`` reads only its
    alias, ``using`` only the alias named.
    """

    state_tuple = _strings(states, "states")
    for state in state_tuple:
        if state not in JobState.values():
            raise InvalidJob(
                f"states has {state!r}; job states are {', '.join(JobState.values())}",
                field="states",
            )
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidJob(f"limit must be a non-negative integer, not {limit!r}", field="limit")
    if queue is not None:
        validation.queue_name(queue)
    if ordering_key is not None and queue is None:
        raise InvalidJob(
            "ordering_key needs queue: a key is a lane within its queue", field="ordering_key"
        )
    prios = tuple(validation.priority(p) for p in priorities or ())
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise InvalidJob(f"metadata must be a dict, not {metadata!r}", field="metadata")
        metadata = validation.json_normalize(dict(metadata), "metadata")
    params = JobListParams(
        queue=queue,
        kinds=_strings(kinds, "kinds"),
        states=state_tuple,
        ordering_key=validation.key(ordering_key, "ordering_key"),
        newest_first=bool(newest_first),
        after=None if after is None else parse_job_id(after, "after"),
        limit=limit,
        ids=tuple(parse_job_id(i, "ids") for i in ids or ()),
        priorities=prios,
        tags_any=_strings(tags_any, "tags_any"),
        tags_all=_strings(tags_all, "tags_all"),
        metadata=dict(metadata) if metadata is not None else None,
    )
    if using is not None:
        aliases = _aliases(using)
    elif queue is not None:
        aliases = [topology.queue_alias(queue)]
    else:
        aliases = topology.aliases()
    if len(aliases) == 1:
        return get_engine(aliases[0]).job_list(params)
    rows = [row for alias in aliases for row in get_engine(alias).job_list(params)]
    rows.sort(key=lambda row: row.id, reverse=bool(newest_first))
    return rows[:limit]


def erase_subject(subject: str) -> ErasureRow:
    """Remove a data subject's data from every job that carries it, atomically.

    Every job enqueued with ``.using(subject=...)`` of this subject loses what
    it was handed and what it produced: arguments, metadata, tags, keys,
    errors, progress (a resumable run's cursor and counters), output, step
    results and attempt logs, live and in history. A waiting or running job
    ends, discarded (a running attempt is fenced and asked to cancel: nothing
    it writes afterwards is stored). The jobs stay readable, marked
    ``erased_at``; the returned record (kept in ``hopper_erasure``) says when
    and how many rows, naming the subject by its SHA-256 digest only. Runs in
    the caller's transaction, if any. What is and is not erased:
    docs/privacy.md.

    With queues on several aliases (``HOPPER["QUEUE_DATABASES"]``) every alias
    is erased, ``DATABASE`` first, each on its own connection (there is no
    transaction across databases) and each keeping its own record; the
    record returned is ``DATABASE``'s with the counts of every alias added.
    If an alias fails, the exception says so: erase again (an erasure
    finds nothing left where it already ran).
    """

    params = SubjectEraseParams(subject=subject)
    aliases = topology.aliases()
    record = get_engine(aliases[0]).subject_erase(params)
    for alias in aliases[1:]:
        other = get_engine(alias).subject_erase(params)
        record = dataclasses.replace(
            record,
            jobs=record.jobs + other.jobs,
            running=record.running + other.running,
            steps=record.steps + other.steps,
            logs=record.logs + other.logs,
            results=record.results + other.results,
            ended=[*record.ended, *other.ended],
        )
    return record


def subject_erasures(subject: str) -> list[ErasureRow]:
    """Return the erasures recorded for a subject on every alias, oldest first (by its digest)."""

    from django_hopper.models import Erasure  # noqa: PLC0415 - the api imports no models at load

    digest = hashlib.sha256(checks.subject(subject).encode()).hexdigest()
    rows = sorted(
        (
            row
            for alias in topology.aliases()
            for row in Erasure.objects.using(get_engine(alias).alias)
            .filter(subject_digest=digest)
            .order_by("id")
        ),
        key=lambda row: row.erased_at,
    )
    return [
        ErasureRow(
            id=r.id,
            subject_digest=r.subject_digest,
            erased_at=r.erased_at,
            jobs=r.jobs,
            running=r.running,
            steps=r.steps,
            logs=r.logs,
            results=r.results,
        )
        for r in rows
    ]
