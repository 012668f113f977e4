"""Input validation shared by every entry point, so a rule is written once.

Everything here raises :class:`~django_hopper.exceptions.InvalidJob` (a
``ValueError``) naming the field, before anything is written.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from django_hopper.exceptions import InvalidJob, UnknownQueue
from django_hopper.models import PRIORITY_MAX, PRIORITY_MIN

QUEUE_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def queue_name(value: Any, field: str = "queue") -> str:
    """Return a valid queue name or raise UnknownQueue naming the problem."""
    if not isinstance(value, str) or not value:
        raise UnknownQueue(f"{field} must be a non-empty string, not {value!r}", field=field)
    if not QUEUE_RE.match(value):
        raise UnknownQueue(
            f"{field} {value!r} is malformed: use letters, digits, '_', '-', '.' and ':' "
            "(at most 128 characters)",
            field=field,
        )
    return value


def priority(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidJob(f"priority must be an integer, not {value!r}", field="priority")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidJob(
            f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, not {value}",
            field="priority",
        )
    return value


def max_attempts(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidJob(f"max_attempts must be an integer of at least 1, not {value!r}",
                         field="max_attempts")
    return value


def aware(value: Any, field: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise InvalidJob(f"{field} must be a datetime or timedelta, not {value!r}", field=field)
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidJob(f"{field} must be timezone-aware, not the naive {value!r}", field=field)
    return value.astimezone(dt.UTC)


def positive_duration(value: Any, field: str) -> dt.timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = dt.timedelta(seconds=value)
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise InvalidJob(f"{field} must be a positive duration, not {value!r}", field=field)
    return value


def json_value(value: Any, field: str) -> Any:
    """Refuse anything that does not survive a JSON round trip unchanged in kind."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"{field} must be JSON-serializable: {exc}", field=field) from None
    return value


def key(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255:
        raise InvalidJob(f"{field} must be a non-empty string of at most 255 characters, "
                         f"not {value!r}", field=field)
    return value


def tags(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(t, str) and t for t in value):
        raise InvalidJob(f"tags must be a list of non-empty strings, not {value!r}", field="tags")
    seen: dict[str, None] = {}
    for t in value:
        seen.setdefault(t, None)
    return tuple(seen)
