"""Rows <-> dataclasses for the PostgreSQL engine.

Every job query returns :data:`~django_hopper.engine.queries.JOB_COLUMNS` in
that order, so a row converts by position (named by
:data:`~django_hopper.engine.queries.COL`), which keeps the claim and the insert
cheap in Python.
Parameters go the other way: a batch of inputs becomes one array per column,
for ``unnest`` (or one tuple per job, for COPY).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django_hopper.engine import decode
from django_hopper.engine.decode import Codec
from django_hopper.engine.encode import dump_json
from django_hopper.engine.params import JobFinalize, JobInsertParams
from django_hopper.ids import new_ids
from django_hopper.types import (
    AttemptError,
    AttemptLog,
    ClientRow,
    JobRow,
    QueueLimits,
    QueueRow,
)

_raw_decode = json.JSONDecoder().raw_decode


def load_json(value: Any) -> Any:
    """Decode a jsonb column; Django's connection hands jsonb over as text.

    The empty object and list, which most jobs carry as metadata, errors and
    tags, are built directly (a fresh one each time): a claim decodes four
    JSON values per job. Other text goes to the decoder without
    ``json.loads``'s wrapper (a third of its cost on a job's arguments):
    jsonb's text has no surrounding whitespace; anything else the decoder
    stops short of is left to ``json.loads``, which accepts or refuses it.
    """
    if isinstance(value, str):
        if value == "{}":
            return {}
        if value == "[]":
            return []
        try:
            decoded, end = _raw_decode(value)
        except ValueError:
            return json.loads(value)
        if end != len(value):
            return json.loads(value)
        return decoded
    return value


_CODEC = Codec(json=load_json)


def job_from_row(r: Sequence[Any]) -> JobRow:
    """Build a JobRow from a row of JOB_COLUMNS (tolerantly: engine/decode.py)."""
    return decode.job_from_row(r, _CODEC)


def log_from_row(r: Sequence[Any]) -> AttemptLog:
    """Build an AttemptLog from (attempt, snoozed, log)."""
    return AttemptLog(attempt=r[0], snoozed=r[1], log=r[2])


def client_from_row(r: Sequence[Any]) -> ClientRow:
    """Build a ClientRow from (id, hostname, started_at, expires_at, info)."""
    return ClientRow(id=r[0], hostname=r[1], started_at=r[2], expires_at=r[3], info=load_json(r[4]))


def queue_from_row(r: Sequence[Any]) -> QueueRow:
    """Build a QueueRow; a NULL limit is no limit (zero)."""
    limits = QueueLimits(
        name=r[0],
        global_limit=r[3] or 0,
        rate_per_sec=r[4] or 0.0,
        rate_burst=r[5] or 0,
        partition_limit=r[6] or 0,
        aging=r[7] or dt.timedelta(0),
    )
    return QueueRow(name=r[0], paused_at=r[1], updated_at=r[2], limits=limits)


# ---------------------------------------------------------------------------
# Inputs


def job_ids(params: Sequence[JobInsertParams]) -> list[uuid.UUID]:
    """Return each input's ID, generating time-ordered ones where none was given."""
    fresh = iter(new_ids(sum(1 for p in params if p.id is None)))
    return [p.id if p.id is not None else next(fresh) for p in params]


def insert_arrays(params: Sequence[JobInsertParams], ids: Sequence[uuid.UUID]) -> dict[str, Any]:
    """Return the column arrays of a batch, for job_insert_many's ``unnest``."""
    return {
        "id": list(ids),
        "kind": [p.kind for p in params],
        "queue": [p.queue for p in params],
        "priority": [p.priority for p in params],
        "max_attempts": [p.max_attempts for p in params],
        "scheduled_at": [p.scheduled_at for p in params],
        "args": [dump_json(p.args, "args") for p in params],
        "metadata": [dump_json(p.metadata, "metadata") for p in params],
        "tags": [dump_json(list(p.tags), "tags") for p in params],
        "unique_key": [p.unique_key for p in params],
        "ordering_key": [p.ordering_key for p in params],
        "partition_key": [p.partition_key for p in params],
        "batch_id": [p.batch_id for p in params],
        "ttl": [p.ttl for p in params],
        "awaited": [bool(p.awaited) for p in params],
        "subject": [p.subject for p in params],
    }


def insert_values(p: JobInsertParams, job_id: uuid.UUID) -> dict[str, Any]:
    """Return the column values of one job without a unique key: :func:`insert_arrays`'s
    element for it, built without the arrays (the one-job insert of ``enqueue()``).

    A test holds the two to the same columns and values.
    """
    return {
        "id": job_id,
        "kind": p.kind,
        "queue": p.queue,
        "priority": p.priority,
        "max_attempts": p.max_attempts,
        "scheduled_at": p.scheduled_at,
        "args": dump_json(p.args, "args"),
        "metadata": dump_json(p.metadata, "metadata"),
        "tags": dump_json(list(p.tags), "tags"),
        "unique_key": None,
        "ordering_key": p.ordering_key,
        "partition_key": p.partition_key,
        "batch_id": p.batch_id,
        "ttl": p.ttl,
        "awaited": bool(p.awaited),
        "subject": p.subject,
    }


def inserted_job(p: JobInsertParams, arrays: dict[str, Any], i: int, r: Sequence[Any]) -> JobRow:
    """Build an inserted job from its input and what the insert returned.

    The insert returns (id, state, scheduled_at, expires_at, created_at), the
    values the database decided; everything else is the input as stored,
    JSON read back from the text that was sent so it compares equal to a read.
    """
    return JobRow(
        id=r[0],
        kind=p.kind,
        queue=p.queue,
        state=r[1],
        priority=p.priority,
        attempt=0,
        max_attempts=p.max_attempts,
        scheduled_at=r[2],
        created_at=r[4],
        args=load_json(arrays["args"][i]),
        metadata=load_json(arrays["metadata"][i]),
        unique_key=p.unique_key,
        ordering_key=p.ordering_key,
        partition_key=p.partition_key,
        tags=list(p.tags),
        batch_id=p.batch_id,
        expires_at=r[3],
        awaited=bool(p.awaited),
        subject=p.subject,
    )


def plain_inserted(
    job_id: uuid.UUID,
    kind: str,
    queue: str,
    priority: int,
    max_attempts: int,
    now: dt.datetime,
    args: str,
) -> JobRow:
    """Build the row ``job_insert_many.one`` wrote (:func:`decode.plain_inserted`)
    from the statement's time and the arguments' JSON text as sent."""
    return decode.plain_inserted(job_id, kind, queue, priority, max_attempts, now, load_json(args))


def uuid_array(values: Sequence[uuid.UUID]) -> str:
    """Return a ``uuid[]`` parameter as one array literal (the statement casts it).

    psycopg dumps a list element by element in Python (a dumper call and a
    quoting test each); the literal is one join: a finalize of 26 results
    dumps in 12 µs instead of 64. Each UUID is written as its 32 hex digits,
    which PostgreSQL reads as well (``str()`` of a UUID costs five times more).
    """
    return "{" + ",".join([f"{v.int:032x}" for v in values]) + "}"


def int_array(values: Sequence[int | None]) -> str:
    """Return an ``int8[]`` parameter as one array literal (None is NULL)."""
    return "{" + ",".join(["NULL" if v is None else str(v) for v in values]) + "}"


def text_array(values: Sequence[str | None]) -> str:
    """Return a ``text[]`` parameter as one array literal (None is NULL).

    Every element is quoted, with its backslashes and double quotes escaped,
    so any text reads back as itself (``NULL`` quoted is the string).
    """
    return (
        "{"
        + ",".join(
            [
                "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                for v in values
            ]
        )
        + "}"
    )


def error_json(error: AttemptError | None) -> str | None:
    """Encode a result's error without ``at``: the statement stamps database time."""
    if error is None:
        return None
    obj = error.to_json()
    obj.pop("at", None)
    return dump_json(obj, "error")


def finalize_arrays(results: Sequence[JobFinalize]) -> dict[str, Any]:
    """Return the column arrays of a batch of results, for job_finalize_many."""
    return {
        "id": [f.id for f in results],
        "attempted_by": [f.attempted_by for f in results],
        "fence": [f.fence for f in results],
        "lease_token": [f.lease_token for f in results],
        "state": [f.state for f in results],
        "delay": [f.delay for f in results],
        "snooze": [bool(f.snooze) for f in results],
        "snooze_reason": [f.snooze_reason for f in results],
        "error": [error_json(f.error) for f in results],
        "output": [None if f.output is None else dump_json(f.output, "output") for f in results],
        "log": [f.log for f in results],
        "archive": [bool(f.archive) for f in results],
    }
