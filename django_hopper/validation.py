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
from django_hopper.types import FINAL_STATES, PRIORITY_MAX, PRIORITY_MIN

QUEUE_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


def queue_name(value: Any, field: str = "queue") -> str:
    """Return a valid queue name or raise UnknownQueue naming the problem."""
    if not isinstance(value, str) or not value:
        raise UnknownQueue(f"{field} must be a non-empty string, not {value!r}", field=field)
    if not QUEUE_RE.fullmatch(value):
        raise UnknownQueue(
            f"{field} {value!r} is malformed: use letters, digits, '_', '-', '.' and ':' "
            "(at most 128 characters)",
            field=field,
        )
    return value


def priority(value: Any) -> int:
    """Return a priority in the Tasks range or raise InvalidJob.

    The range is imported here, not at module level, so that ``@job`` can
    validate while the app registry is still loading (models cannot be
    imported then).
    """

    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidJob(f"priority must be an integer, not {value!r}", field="priority")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidJob(
            f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, not {value}",
            field="priority",
        )
    return value


def max_attempts(value: Any) -> int:
    """Return a maximum number of attempts (at least 1) or raise InvalidJob."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidJob(
            f"max_attempts must be an integer of at least 1, not {value!r}", field="max_attempts"
        )
    return value


def aware(value: Any, field: str) -> dt.datetime:
    """Return an aware datetime in UTC; refuse naive ones, whose zone is a guess."""
    if not isinstance(value, dt.datetime):
        raise InvalidJob(f"{field} must be a datetime or timedelta, not {value!r}", field=field)
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidJob(f"{field} must be timezone-aware, not the naive {value!r}", field=field)
    return value.astimezone(dt.UTC)


#: The longest duration hopper adds to the current time (a TTL, a lease, a
#: delay). Past it the sum would leave the range of a datetime (year 9999) on
#: one engine and be stored on the other; a thousand years is no real limit.
DURATION_MAX = dt.timedelta(days=365_000)


def positive_duration(value: Any, field: str) -> dt.timedelta:
    """Return a positive timedelta (numbers are seconds) of at most :data:`DURATION_MAX`,
    or raise InvalidJob."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            value = dt.timedelta(seconds=value)
        except (OverflowError, ValueError):
            pass  # refused below, as what it is
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise InvalidJob(f"{field} must be a positive duration, not {value!r}", field=field)
    duration_max(value, field)
    return value


def duration_max(value: dt.timedelta, field: str) -> None:
    """Refuse a duration that added to the current time would leave a datetime's range."""
    if value > DURATION_MAX:
        raise InvalidJob(
            f"{field} must be at most {DURATION_MAX.days:,} days (a thousand years), "
            f"not {value!r}; leave it unset for no limit",
            field=field,
        )


#: The shortest pass lease a resumable job may hold. Below it the BEGIN margin
#: (a share of the lease) is shorter than one database round trip under load,
#: and the lease could not be renewed at a step boundary before it expired.
PASS_LEASE_MIN = dt.timedelta(seconds=1)


def pass_lease(value: Any, field: str = "lease") -> dt.timedelta:
    """Return a pass lease (numbers are seconds) of at least :data:`PASS_LEASE_MIN`,
    or raise InvalidJob naming the floor."""
    lease = positive_duration(value, field)
    if lease < PASS_LEASE_MIN:
        raise InvalidJob(
            f"{field} must be at least {PASS_LEASE_MIN.total_seconds():g} second (the pass "
            f"lease floor), not {value!r}: a shorter lease expires before a pass can begin "
            "or renew it",
            field=field,
        )
    return lease


def json_value(value: Any, field: str) -> Any:
    """Refuse anything that does not survive a JSON round trip unchanged in kind."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"{field} must be JSON-serializable: {exc}", field=field) from None
    return value


def kind(value: Any) -> str:
    """Return a job kind (1 to 255 characters, :func:`storable_text`) or raise InvalidJob."""
    if not isinstance(value, str) or not value or len(value) > 255 or not storable_text(value):
        raise InvalidJob(
            "kind must be a non-empty string of at most 255 characters without NUL or a lone "
            f"surrogate, not {value!r}",
            field="kind",
        )
    return value


def key(value: Any, field: str) -> str | None:
    """Return a unique, ordering or partition key (None for no key) or raise InvalidJob."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255 or not storable_text(value):
        raise InvalidJob(
            f"{field} must be a non-empty string of at most 255 characters without NUL or a "
            f"lone surrogate, not {value!r}",
            field=field,
        )
    return value


def tags(value: Any) -> tuple[str, ...]:
    """Return distinct, non-empty tags in their first order or raise InvalidJob."""
    if value is None:
        return ()
    if isinstance(value, str) or not all(
        isinstance(t, str) and t and storable_text(t) for t in value
    ):
        raise InvalidJob(
            f"tags must be a list of non-empty strings without NUL or a lone surrogate, "
            f"not {value!r}",
            field="tags",
        )
    seen: dict[str, None] = {}
    for t in value:
        seen.setdefault(t, None)
    return tuple(seen)


#: PostgreSQL's jsonb cannot hold U+0000 and SQLite's JSON can: one rule for both engines.
_NUL_MESSAGE = (
    "{field} contains a NUL character (\\x00), which a job's JSON cannot store; "
    "remove it or encode the value (base64, hex)"
)


#: A surrogate code point (U+D800-U+DFFF) in a Python string stands alone: a
#: character beyond U+FFFF is one code point. It has no UTF-8 form, so
#: PostgreSQL's jsonb refuses it where SQLite's JSON kept it: refused for both.
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_MESSAGE = (
    "{field} contains a lone surrogate ({char!r}), which has no UTF-8 form and a job's "
    "JSON cannot store; decode the text it came from with errors='replace'"
)


def storable_text(value: str) -> bool:
    """Return whether a database stores ``value`` as sent: no NUL (PostgreSQL
    refuses it), no lone surrogate (no UTF-8 form: PostgreSQL refuses it, SQLite
    stored a row it then could not read back)."""
    return "\x00" not in value and (value.isascii() or _SURROGATE.search(value) is None)


def _refuse_surrogate(value: str, field: str) -> None:
    """Raise InvalidJob if ``value`` has a surrogate code point (never for ASCII)."""
    if not value.isascii():
        found = _SURROGATE.search(value)
        if found is not None:
            raise InvalidJob(
                _SURROGATE_MESSAGE.format(field=field, char=found.group()), field=field
            )


def json_normalize(value: Any, field: str) -> Any:
    """Return ``value`` as it will read back from the database, or raise InvalidJob.

    A job runs later, in another process, with its arguments read back from a
    JSON column, so anything that would come back as something else is refused
    now, at enqueue, instead of failing (or silently changing) at run time.
    Tuples become lists, as JSON has only arrays; dictionary keys must be
    strings, floats finite, and no string (nor key) may contain a NUL
    character, which PostgreSQL cannot store and SQLite can, nor a lone
    surrogate, which has no UTF-8 form. ``field`` is
    the path reported in the error (``kwargs['when']``, ``args[0]``,
    ``metadata['x'][1]``).
    """
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidJob(_NUL_MESSAGE.format(field=field), field=field)
        _refuse_surrogate(value, field)
        return value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidJob(f"{field} must be a finite number, not {value!r}", field=field)
        return value
    if isinstance(value, list | tuple):
        return [json_normalize(item, f"{field}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, item in value.items():
            if not isinstance(k, str):
                raise InvalidJob(
                    f"{field} has the key {k!r}; JSON object keys must be strings", field=field
                )
            if "\x00" in k:
                raise InvalidJob(_NUL_MESSAGE.format(field=f"{field} key {k!r}"), field=field)
            if not k.isascii() and _SURROGATE.search(k):
                raise InvalidJob(
                    _SURROGATE_MESSAGE.format(field=f"{field} key {k!r}", char=k), field=field
                )
            out[k] = json_normalize(item, f"{field}[{k!r}]")
        return out
    raise InvalidJob(
        f"{field} must be JSON (None, bool, int, float, str, list or dict of them), "
        f"not {type(value).__name__} {value!r}",
        field=field,
    )


def unique_finished(value: Any) -> tuple[str, ...]:
    """Return finished states a history job may be in to count as a duplicate."""

    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    states = tuple(dict.fromkeys(value))
    for state in states:
        if state not in FINAL_STATES:
            raise InvalidJob(
                f"unique_finished must name finished states ({', '.join(FINAL_STATES)}), "
                f"not {state!r}",
                field="unique_finished",
            )
    return states


def progress_step(step: Any, keep_step: Any) -> str:
    """Return the step to send with a progress record: a step, or keep_step=True.

    One or the other, never both and never neither: a step given with
    ``keep_step`` would be silently ignored, and no step without it would
    silently clear the stored one.
    """
    if keep_step is True:
        if step is not None:
            raise InvalidJob(
                "pass a step or keep_step=True, not both: keep_step keeps the stored step",
                field="step",
            )
        return ""
    if step is None:
        raise InvalidJob(
            "record_progress needs the step reached, or keep_step=True to keep the stored one",
            field="step",
        )
    if not isinstance(step, str):
        raise InvalidJob(f"step must be a string, not {step!r}", field="step")
    return step
