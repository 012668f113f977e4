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

from django_hopper.engine.base import AttemptError, JobRow, Progress
from django_hopper.exceptions import InvalidJob

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

#: The live job columns every job query selects, in this order; history queries
#: add ``finalized_at`` and ``output``.
JOB_COLUMNS = (
    "id",
    "kind",
    "queue",
    "state",
    "priority",
    "attempt",
    "max_attempts",
    "scheduled_at",
    "attempted_at",
    "attempted_by",
    "fence",
    "args",
    "metadata",
    "errors",
    "unique_key",
    "ordering_key",
    "partition_key",
    "tags",
    "batch_id",
    "expires_at",
    "cancel_requested_at",
    "awaited",
    "created_at",
    "snooze_reason",
    "progress",
    "lease_token",
    "lease_expires_at",
    "lease_renewed_at",
)
N_LIVE = len(JOB_COLUMNS)
N_HISTORY = N_LIVE + 2


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
    """Build a JobRow from a row of JOB_COLUMNS (plus finalized_at, output for history)."""
    tm = from_db_time
    errors = r[13]
    progress = r[24]
    history = len(r) >= N_HISTORY
    output = r[29] if history else None
    return JobRow(
        id=_UUID(r[0]),
        kind=r[1],
        queue=r[2],
        state=r[3],
        priority=r[4],
        attempt=r[5],
        max_attempts=r[6],
        scheduled_at=tm(r[7]),
        attempted_at=tm(r[8]),
        attempted_by=r[9],
        fence=r[10],
        args=_loads(r[11]),
        metadata=_loads(r[12]),
        errors=[AttemptError.from_json(e) for e in _loads(errors)] if errors != "[]" else [],
        unique_key=r[14],
        ordering_key=r[15],
        partition_key=r[16],
        tags=_loads(r[17]),
        batch_id=None if r[18] is None else _UUID(r[18]),
        expires_at=tm(r[19]),
        cancel_requested_at=tm(r[20]),
        awaited=bool(r[21]),
        created_at=tm(r[22]),
        snooze_reason=r[23],
        progress=Progress.from_json(_loads(progress)) if progress is not None else None,
        lease_expires_at=tm(r[26]),
        finalized_at=tm(r[28]) if history else None,
        output=_loads(output) if output is not None else None,
        # A query that selects the step adds it after output (issue 5).
        step=r[30] if len(r) > N_HISTORY else None,
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
