"""Conversion between SQLite values and the engine's dataclasses.

SQLite keeps times as text, UUIDs as 32 hex characters and JSON as text. Django's
sqlite connection parses columns declared ``datetime`` into naive datetimes and
``bool`` columns into bools, but only for plain column references; expressions
come back as text and integers. Every reader here accepts both forms.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, overload

from django_hopper.engine import decode
from django_hopper.engine.decode import Codec
from django_hopper.engine.encode import dump_json
from django_hopper.engine.params import JobInsertParams
from django_hopper.exceptions import InvalidJob
from django_hopper.ids import uuid_from_int
from django_hopper.types import JobID, JobRow

UTC = dt.UTC
_raw_decode = json.JSONDecoder().raw_decode


def _loads(text: str) -> Any:
    """Parse stored JSON text; the common empty values skip the decoder."""
    if text == "{}":
        return {}
    if text == "[]":
        return []
    try:
        return _raw_decode(text)[0]
    except ValueError:
        return json.loads(text)  # leading whitespace, as another writer may store


_UUID = uuid.UUID
_fromiso = dt.datetime.fromisoformat


def db_time(value: dt.datetime, field: str = "now") -> str:
    """Return the stored text of an aware time: UTC, always six fraction digits.

    A fixed width keeps text order equal to time order, which every comparison
    in the SQL relies on.
    """
    if value.tzinfo is None:
        raise InvalidJob(f"{field} must be timezone-aware, not the naive {value!r}", field=field)
    if value.utcoffset():
        value = value.astimezone(UTC)
    return value.replace(tzinfo=None).isoformat(" ", "microseconds")


@overload
def from_db_time(value: None) -> None: ...
@overload
def from_db_time(value: str | dt.datetime) -> dt.datetime: ...
@overload
def from_db_time(value: Any) -> dt.datetime | None: ...


def from_db_time(value: Any) -> dt.datetime | None:
    """Parse a stored time (text, or a naive datetime Django already parsed) as aware UTC.

    A text seen lately is parsed once (:data:`_TIMES`): the jobs of one claim
    share their attempt time, and jobs enqueued together their creation and
    schedule times, so most of a claim's times are repeats.
    """
    if value is None:
        return None
    if type(value) is str:
        parsed = _TIMES.get(value)
        if parsed is None:
            parsed = _aware(_fromiso(value))
            if len(_TIMES) >= _TIMES_KEPT:
                _TIMES.clear()
            _TIMES[value] = parsed
        return parsed
    return _aware(value)


def _aware(value: dt.datetime) -> dt.datetime:
    """Return a stored time as aware UTC (naive stored times are UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


#: Stored time texts already parsed (a datetime is immutable, so shared safely),
#: emptied when full: a bound on memory, not a cache that must stay warm.
_TIMES: dict[str, dt.datetime] = {}
_TIMES_KEPT = 1024


_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

#: Encode a JSON column value: the one encoder of both engines.
dumps = dump_json


def uuid_or_none(value: str | None) -> uuid.UUID | None:
    """Parse a stored UUID (32 hex characters), keeping NULL as None."""
    return None if value is None else _UUID(value)


_from_bytes = int.from_bytes
_fromhex = bytes.fromhex


def from_db_uuid(value: str) -> uuid.UUID:
    """Parse a stored UUID: 32 hex characters, as ``uuid.UUID(value)`` would.

    Built from its integer without ``UUID.__init__``'s general parsing (a
    third of a claimed row's decoding); any other text goes through
    ``uuid.UUID``, which accepts or rejects it as before.
    """
    if type(value) is str and len(value) == 32:
        try:
            raw = _fromhex(value)
        except ValueError:
            return _UUID(value)
        if len(raw) == 16:
            return uuid_from_int(_from_bytes(raw))
    return _UUID(value)


_CODEC = Codec(json=_loads, time=from_db_time, uuid=from_db_uuid)


def job_from_row(r: Sequence[Any]) -> JobRow:
    """Build a JobRow from a row of JOB_COLUMNS (tolerantly: engine/decode.py)."""
    return decode.job_from_row(r, _CODEC)


# ---------------------------------------------------------------------------
# Appending to a job's errors, registered as an SQL function


def sql_json_append(doc: str | None, item: str | None) -> str | None:
    """Append the JSON ``item`` to the stored JSON list ``doc``, as PostgreSQL's
    ``errors || jsonb_build_array(item)`` does, without failing on a bad ``doc``.

    A list gets the item at its end; any other valid JSON value becomes the
    first element of a list, and text that is not JSON its first element as a
    string, so recording an attempt's error never fails because an earlier
    value does not decode (the evidence is kept, the row reports it).
    """
    if item is None:
        return doc
    entry = json.loads(item)
    if doc is None:
        return _encode([entry])
    try:
        value = _loads(doc)
    except ValueError:
        value = doc
    if isinstance(value, list):
        return _encode([*value, entry])
    return _encode([value, entry])


# ---------------------------------------------------------------------------
# JSON containment (PostgreSQL ``jsonb @>``), registered as an SQL function


def json_contains(doc: Any, pattern: Any) -> bool:
    """Return whether ``doc`` contains ``pattern`` as PostgreSQL's ``@>`` decides.

    Objects: every key of the pattern is in the document with a contained
    value. Arrays: every element of the pattern is contained in some element
    of the document. Scalars: equal, with JSON's types kept apart (``true`` is
    not ``1``). Written once here so the SQLite engine cannot drift from it.
    """
    if isinstance(pattern, dict):
        if not isinstance(doc, dict):
            return False
        for key, value in pattern.items():
            if key not in doc or not json_contains(doc[key], value):
                return False
        return True
    if isinstance(pattern, list):
        if not isinstance(doc, list):
            return False
        return all(any(json_contains(d, p) for d in doc) for p in pattern)
    if isinstance(doc, dict | list):
        return False
    if isinstance(pattern, bool) or isinstance(doc, bool):
        return type(pattern) is type(doc) and pattern == doc
    if isinstance(pattern, int | float) and isinstance(doc, int | float):
        return pattern == doc
    return type(pattern) is type(doc) and pattern == doc


@lru_cache(maxsize=64)
def _pattern(text: str) -> Any:
    """Parse a containment pattern once per distinct text, not once per row."""
    return _loads(text)


def sql_json_contains(doc: str | None, pattern: str | None) -> int | None:
    """Adapt json_contains to an SQL function of two JSON texts (NULL-propagating)."""
    if doc is None or pattern is None:
        return None
    try:
        value = _loads(doc)
    except ValueError:
        return 0  # a stored value that is not JSON contains nothing; the read goes on
    return int(json_contains(value, _pattern(pattern)))


def inserted_row(
    job_id: JobID,
    p: JobInsertParams,
    state: str,
    sched: dt.datetime,
    now: dt.datetime,
    tags: list[str],
    expires: dt.datetime | None,
    args: str,
    metadata: str,
    **extra: Any,
) -> JobRow:
    """Return the row of a job just inserted from ``p`` (times in UTC), its
    ``args`` and ``metadata`` as stored from the JSON texts the insert wrote
    (:func:`decode.as_stored`); ``extra`` are the fields a plain insert and a
    workflow's set differently."""
    return JobRow(
        id=job_id,
        kind=p.kind,
        queue=p.queue,
        state=state,
        priority=p.priority,
        attempt=0,
        max_attempts=p.max_attempts,
        scheduled_at=sched.astimezone(dt.UTC),
        created_at=now.astimezone(dt.UTC),
        args=decode.as_stored(p.args, args, _loads),
        metadata=decode.as_stored(p.metadata, metadata, _loads),
        ordering_key=p.ordering_key,
        partition_key=p.partition_key,
        tags=tags,
        expires_at=expires.astimezone(dt.UTC) if expires is not None else None,
        awaited=p.awaited,
        subject=p.subject,
        **extra,
    )


def plain_inserted(
    job_id: JobID,
    kind: str,
    queue: str,
    priority: int,
    max_attempts: int,
    now: dt.datetime,
    args: str,
) -> JobRow:
    """Build the row ``job_insert_many.one`` wrote (:func:`decode.plain_inserted`)
    from the arguments' JSON text as written, its time in UTC as the engine's
    other reads return it."""
    return decode.plain_inserted(
        job_id, kind, queue, priority, max_attempts, now.astimezone(dt.UTC), _loads(args)
    )
