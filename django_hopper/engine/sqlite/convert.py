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

from django_hopper.engine.queries import COL
from django_hopper.exceptions import InvalidJob
from django_hopper.types import AttemptError, JobRow, Progress

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
    """Parse a stored time (text, or a naive datetime Django already parsed) as aware UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = _fromiso(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def dumps(value: Any, field: str) -> str:
    """Serialize a JSON column value, refusing what JSON cannot represent."""
    if not value and type(value) is dict:
        return "{}"  # the common empty metadata, without the encoder
    try:
        return _encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"{field} must be JSON-serializable: {exc}", field=field) from None


def uuid_or_none(value: str | None) -> uuid.UUID | None:
    """Parse a stored UUID (32 hex characters), keeping NULL as None."""
    return None if value is None else _UUID(value)


def job_from_row(r: Sequence[Any]) -> JobRow:
    """Build a JobRow from a row of :data:`~django_hopper.engine.queries.JOB_COLUMNS`."""
    tm = from_db_time
    errors = r[COL.errors]
    progress = r[COL.progress]
    output = r[COL.output]
    return JobRow(
        id=_UUID(r[COL.id]),
        kind=r[COL.kind],
        queue=r[COL.queue],
        state=r[COL.state],
        priority=r[COL.priority],
        attempt=r[COL.attempt],
        max_attempts=r[COL.max_attempts],
        scheduled_at=tm(r[COL.scheduled_at]),
        attempted_at=tm(r[COL.attempted_at]),
        attempted_by=r[COL.attempted_by],
        fence=r[COL.fence],
        args=_loads(r[COL.args]),
        metadata=_loads(r[COL.metadata]),
        errors=[AttemptError.from_json(e) for e in _loads(errors)] if errors != "[]" else [],
        unique_key=r[COL.unique_key],
        ordering_key=r[COL.ordering_key],
        partition_key=r[COL.partition_key],
        tags=_loads(r[COL.tags]),
        batch_id=None if r[COL.batch_id] is None else _UUID(r[COL.batch_id]),
        expires_at=tm(r[COL.expires_at]),
        cancel_requested_at=tm(r[COL.cancel_requested_at]),
        awaited=bool(r[COL.awaited]),
        created_at=tm(r[COL.created_at]),
        snooze_reason=r[COL.snooze_reason],
        progress=Progress.from_json(_loads(progress)) if progress is not None else None,
        lease_expires_at=tm(r[COL.lease_expires_at]),
        finalized_at=tm(r[COL.finalized_at]),
        output=_loads(output) if output is not None else None,
        step=r[COL.step],
    )


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
    return int(json_contains(_loads(doc), _pattern(pattern)))
