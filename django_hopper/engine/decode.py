"""Job rows from stored values, tolerantly: one bad value never poisons a read.

Every job query of both engines returns the columns of
:data:`~django_hopper.engine.queries.JOB_COLUMNS`; :func:`job_from_row` builds
the :class:`JobRow` from them for both, given how the engine stores JSON, times
and UUIDs (a :class:`Codec`).

The rule (docs/engine-semantics.md, "Values that do not decode"): a stored
value that does not decode, or decodes to the wrong shape (``progress`` that
is a string or a list, an ``"at"`` that is not a date, ``errors`` that is not a
list of objects, ``tags`` that are not strings, ``metadata`` that is not an
object, a time or UUID SQLite cannot read; both engines refuse to store JSON that
does not parse), makes
only that row different: the field reads as its empty value (``{}``, ``[]``,
``None``; a required time as :data:`EPOCH`) and ``JobRow.decode_error`` names
every such field with its parse error. Reads (``job_get``, ``job_list``,
history, rescue candidates) return the row like that, so every other row of
the page is unaffected; a claim fails the job's attempt instead of running it
(:func:`undecodable_result`), since work cannot start from a value it cannot
read: strict where work happens, tolerant where evidence is read.

The row's identity (``id``, ``kind``, ``queue``, ``state``, the counters) is
plain columns the database types itself and is read as stored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_hopper.engine.params import JobClaimParams, JobFinalize, JobFinalizeParams
from django_hopper.engine.queries import COL, JOB_WIDTH
from django_hopper.engine.rules import rescued_state
from django_hopper.exceptions import JobNotClaimable
from django_hopper.retry import backoff
from django_hopper.types import AttemptError, JobID, JobRow, JobState, Progress, RescueReason

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine

logger = logging.getLogger("django_hopper.engine")

#: What a required time that does not decode reads as (with the row's decode_error).
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class Codec:
    """How an engine stores the values a job row decodes."""

    #: Stored JSON to a value (the empty object and list most jobs carry are common).
    json: Callable[[Any], Any]
    #: A stored time to an aware datetime (None stays None).
    time: Callable[[Any], dt.datetime | None] = _same
    #: A stored UUID to a UUID (None stays None).
    uuid: Callable[[Any], Any] = _same


# ---------------------------------------------------------------------------
# Shapes: each returns the decoded value or raises with a message that says why.


def _metadata(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, not {_kind(value)}")
    return value


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if value == []:  # most jobs: nothing to check
        return value
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"expected a list of strings, not {_kind(value)}")
    return value


def _errors(value: Any) -> list[AttemptError]:
    if not value:
        return []
    if not isinstance(value, list):
        raise ValueError(f"expected a list of objects, not {_kind(value)}")
    out = []
    for entry in value:
        if not isinstance(entry, dict):
            raise ValueError(f"expected a list of objects, not a list holding {_kind(entry)}")
        out.append(AttemptError.from_json(entry))
    return out


def _progress(value: Any) -> Progress | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, not {_kind(value)}")
    step, at = value.get("step"), value.get("at")
    if step is not None and not isinstance(step, str):
        raise ValueError(f"step must be a string, not {_kind(step)}")
    if at is not None and not isinstance(at, str):
        raise ValueError(f"at must be an ISO 8601 time, not {_kind(at)}")
    return Progress.from_json(value)


def _kind(value: Any) -> str:
    """Name a JSON value's type the way an operator reads it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"the {type(value).__name__} {value!r}"


# ---------------------------------------------------------------------------
# Rows


def job_from_row(r: Sequence[Any], codec: Codec) -> JobRow:
    """Build a JobRow from a row of JOB_COLUMNS; never raise for a stored value.

    The usual row decodes in one pass; a row with a value that does not decode
    is decoded again field by field, so that only its bad fields are empty.
    """
    try:
        return _strict(r, codec)
    except Exception:
        return _tolerant(r, codec)


def _strict(r: Sequence[Any], c: Codec) -> JobRow:
    """Decode a row in one pass; raise on the first value that does not decode.

    The row is unpacked by position once (the names follow JOB_COLUMNS, which
    a test pins), and times and UUIDs are converted only for an engine whose
    driver does not type them itself: this runs for every claimed job.
    """
    (
        id_, kind, queue, state, priority, attempt, max_attempts, scheduled_at,
        attempted_at, attempted_by, fence, args, metadata, errors, unique_key,
        ordering_key, partition_key, tags, batch_id, expires_at, cancel_requested_at,
        awaited, created_at, snooze_reason, progress, _lease_token, lease_expires_at,
        _lease_renewed_at, step, subject, erased_at, finalized_at, output,
    ) = r if len(r) == JOB_WIDTH else r[:JOB_WIDTH]  # fmt: skip
    tm = c.time
    if tm is not _same:
        # NULL stays None (the codec's rule) without a call: most of a claimed
        # row's optional times are NULL.
        scheduled_at, created_at = tm(scheduled_at), tm(created_at)
        if attempted_at is not None:
            attempted_at = tm(attempted_at)
        if expires_at is not None:
            expires_at = tm(expires_at)
        if cancel_requested_at is not None:
            cancel_requested_at = tm(cancel_requested_at)
        if lease_expires_at is not None:
            lease_expires_at = tm(lease_expires_at)
        if finalized_at is not None:
            finalized_at = tm(finalized_at)
        if erased_at is not None:
            erased_at = tm(erased_at)
    if scheduled_at is None or created_at is None:
        raise ValueError("a required time is NULL")
    uu = c.uuid
    if uu is not _same:
        id_ = uu(id_)
        if batch_id is not None:
            batch_id = uu(batch_id)
    js = c.json
    # The shapes' common cases inline (an object, no tags, no errors); anything
    # else goes through the shape's check, which accepts or raises as before.
    metadata = js(metadata)
    if type(metadata) is not dict:
        metadata = _metadata(metadata)
    tags = js(tags)
    if tags is None:
        tags = []
    elif type(tags) is not list or tags:
        tags = _tags(tags)
    errors = js(errors)
    errors = _errors(errors) if errors else []
    # Positional, in JobRow's field order (checked at import, below _ROW_FIELDS).
    return JobRow(
        id_,
        kind,
        queue,
        state,
        priority,
        attempt,
        max_attempts,
        scheduled_at,
        created_at,
        js(args),
        metadata,
        errors,
        attempted_at,
        attempted_by,
        fence,
        unique_key,
        ordering_key,
        partition_key,
        tags,
        batch_id,
        expires_at,
        cancel_requested_at,
        lease_expires_at,
        bool(awaited),
        snooze_reason if state == JobState.SCHEDULED else None,
        None if progress is None else _progress(js(progress)),
        finalized_at,
        None if output is None else js(output),
        None,  # dependencies: attached by the claim
        step,
        subject,
        erased_at,
    )


#: JobRow's fields as _strict passes them, by position.
_ROW_FIELDS = (
    "id", "kind", "queue", "state", "priority", "attempt", "max_attempts", "scheduled_at",
    "created_at", "args", "metadata", "errors", "attempted_at", "attempted_by", "fence",
    "unique_key", "ordering_key", "partition_key", "tags", "batch_id", "expires_at",
    "cancel_requested_at", "lease_expires_at", "awaited", "snooze_reason", "progress",
    "finalized_at", "output", "dependencies", "step", "subject", "erased_at",
)  # fmt: skip
if tuple(f.name for f in dataclasses.fields(JobRow))[: len(_ROW_FIELDS)] != _ROW_FIELDS:
    raise ImportError("decode._strict passes JobRow's fields by position: update it with them")


def _required(value: dt.datetime | None) -> dt.datetime:
    if value is None:
        raise ValueError("a required time is NULL")
    return value


def _tolerant(r: Sequence[Any], c: Codec) -> JobRow:
    """Decode each stored value on its own; name the ones that fail."""
    problems: list[str] = []

    def field(name: str, decode: Callable[[Any], Any], empty: Any) -> Any:
        raw = r[getattr(COL, name)]
        try:
            return decode(raw)
        except Exception as exc:
            problems.append(f"{name}: {exc}")
            return empty

    def time(name: str, empty: dt.datetime | None = None) -> dt.datetime | None:
        required = empty is not None
        return field(name, (lambda v: _required(c.time(v))) if required else c.time, empty)

    def opt_json(decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda v: None if v is None else decode(c.json(v))

    state = r[COL.state]
    job = JobRow(
        id=c.uuid(r[COL.id]),
        kind=r[COL.kind],
        queue=r[COL.queue],
        state=state,
        priority=r[COL.priority],
        attempt=r[COL.attempt],
        max_attempts=r[COL.max_attempts],
        scheduled_at=time("scheduled_at", EPOCH),  # type: ignore[arg-type]
        created_at=time("created_at", EPOCH),  # type: ignore[arg-type]
        args=field("args", c.json, {}),
        metadata=field("metadata", lambda v: _metadata(c.json(v)), {}),
        errors=field("errors", lambda v: _errors(c.json(v)), []),
        attempted_at=time("attempted_at"),
        attempted_by=r[COL.attempted_by],
        fence=r[COL.fence],
        unique_key=r[COL.unique_key],
        ordering_key=r[COL.ordering_key],
        partition_key=r[COL.partition_key],
        tags=field("tags", lambda v: _tags(c.json(v)), []),
        batch_id=field("batch_id", lambda v: None if v is None else c.uuid(v), None),
        expires_at=time("expires_at"),
        cancel_requested_at=time("cancel_requested_at"),
        lease_expires_at=time("lease_expires_at"),
        awaited=bool(r[COL.awaited]),
        snooze_reason=r[COL.snooze_reason] if state == JobState.SCHEDULED else None,
        progress=field("progress", opt_json(_progress), None),
        finalized_at=time("finalized_at"),
        output=field("output", opt_json(_same), None),
        step=r[COL.step],
        subject=r[COL.subject],
        erased_at=time("erased_at"),
    )
    job.decode_error = "; ".join(problems) or "the row does not decode"
    return job


#: The types a JSON value reads back as (bool and None as themselves).
_SCALARS = frozenset((str, int, float, bool, type(None)))


def json_normal(value: Any) -> bool:
    """Return whether ``value`` reads back from a JSON column as itself.

    True for None, bools, ints, floats and strings of exactly those types,
    and lists and dicts (not subclasses) of them with string keys; False for
    what JSON encodes as something else: a tuple (a list), a non-string key
    (its string), a subclass (its base type). A walk without recursion that
    allocates only its stack: about the time of decoding the text again for
    a job's usual arguments (0.4-0.7 µs), and no new objects.
    """
    kind = type(value)
    if kind is not dict and kind is not list:
        return kind in _SCALARS
    if not value:
        return True  # most metadata: nothing to walk
    scalars = _SCALARS
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        if type(node) is dict:
            for key in node:
                if type(key) is not str:
                    return False
            items = node.values()
        else:
            items = node
        for item in items:
            kind = type(item)
            if kind is dict or kind is list:
                if item:
                    push(item)
            elif kind not in scalars:
                return False
    return True


def as_stored(value: Any, text: str, loads: Callable[[str], Any]) -> Any:
    """Return a JSON value an insert wrote as ``text`` (encoded from ``value``)
    as a read of the row returns it.

    Both engines' inserted rows take their JSON from here (or decode ``text``
    outright), so the row an insert returns equals what ``job_get`` reads:
    ``value`` itself when it reads back as itself (:func:`json_normal`, every
    ``enqueue()``, whose arguments are normalized), else ``text`` decoded
    (``{1: "a"}`` is ``{"1": "a"}``, a tuple a list).
    """
    return value if json_normal(value) else loads(text)


def plain_inserted(
    job_id: JobID,
    kind: str,
    queue: str,
    priority: int,
    max_attempts: int,
    now: dt.datetime,
    args: Any,
) -> JobRow:
    """Return the row of a job inserted available from ``now`` with every field
    but these at its default (the common ``enqueue()``).

    Both engines build an insert's row this way when it is first read, from the
    statement's time (aware) and the arguments decoded from the text the insert
    wrote (so they equal what a read returns, whatever object the caller
    passed), so an enqueue that keeps only the ID never pays for it, and the
    two engines' rows cannot drift.
    """
    return JobRow(
        id=job_id,
        kind=kind,
        queue=queue,
        state=JobState.AVAILABLE,
        priority=priority,
        attempt=0,
        max_attempts=max_attempts,
        scheduled_at=now,
        created_at=now,
        args=args,
        metadata={},
        tags=[],
        errors=[],
    )


# ---------------------------------------------------------------------------
# Claims


def undecodable_result(job: JobRow, lease_token: JobID | None = None) -> JobFinalize:
    """Return how hopper ends a claimed attempt whose stored values do not decode.

    The worker's rule for a failed attempt: retried after backoff (an operator
    may correct the value meanwhile), discarded once out of attempts, canceled
    if a cancel was requested; the error names the fields and why.
    """
    state = rescued_state(job)
    return JobFinalize(
        id=job.id,
        attempted_by=None if lease_token is not None else job.attempted_by,
        lease_token=lease_token,
        fence=job.fence,
        state=state,
        delay=backoff(job.attempt) if state == JobState.RETRYABLE else dt.timedelta(0),
        error=AttemptError(
            at=None,
            attempt=job.attempt,
            error=f"stored values do not decode: {job.decode_error}",
            fence=job.fence,
            rescue=RescueReason.UNDECODABLE,
        ),
    )


def runnable(engine: BaseEngine, params: JobClaimParams, jobs: list[JobRow]) -> list[JobRow]:
    """Return a claim's jobs that can run; end the attempts of those that do not decode.

    Each bad job is finalized fenced to the claim that returned it
    (undecodable_result), so it fails alone with its reason in its errors, and
    the claim is repeated for as many jobs, so that a claim is never short (or
    empty, which a burst worker reads as "queue drained") because of it. The
    failed jobs wait out their backoff or leave, so the repeat cannot take them
    again at the same time. Should this process die before the finalize, the
    job is running without a worker and the rescue ends its attempt.
    """
    bad = [j for j in jobs if j.decode_error is not None]
    if not bad:
        return jobs
    for job in bad:
        logger.error("job %s (%s) cannot run: %s", job.id, job.kind, job.decode_error)
    engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[undecodable_result(j) for j in bad],
            no_batches=all(j.batch_id is None for j in bad),
            now=params.now,
        )
    )
    more = engine.job_claim(dataclasses.replace(params, limit=len(bad), ahead=0)).jobs
    return [j for j in jobs if j.decode_error is None] + more


def refuse_undecodable_lease(
    engine: BaseEngine, job: JobRow, lease_token: JobID, now: dt.datetime | None
) -> Exception:
    """End a job claimed by ID whose stored values do not decode; return what to raise.

    The attempt fails fenced to the new lease (undecodable_result), so the run
    is retried or discarded like any failed pass, and the caller of the claim
    learns why instead of driving a pass from values it cannot read.
    """
    logger.error("job %s (%s) cannot run: %s", job.id, job.kind, job.decode_error)
    engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[undecodable_result(job, lease_token)],
            no_batches=job.batch_id is None,
            now=now,
        )
    )
    return JobNotClaimable(
        f"job {job.id} cannot run: stored values do not decode: {job.decode_error}"
    )
