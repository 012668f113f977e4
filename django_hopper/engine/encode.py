"""JSON going into the database, encoded the same way by both engines.

PostgreSQL's ``jsonb`` cannot hold U+0000 and SQLite's JSON text can, so a
NUL anywhere in a value is refused here, naming where it is, instead of one
engine storing it and the other failing with a driver error.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django_hopper import validation
from django_hopper.exceptions import InvalidJob

_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

#: ``\u0000`` in the encoded text that is an escape of its own: preceded by an
#: even number of backslashes (an odd number makes it the text ``\u0000``).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dump_json(value: Any, field: str) -> str:
    """Encode a JSON column value, refusing what JSON (or one engine) cannot hold.

    The empty object and list (most jobs' metadata and tags) are written
    directly, without the encoder. The error names ``field`` and, for a NUL,
    the path to it.
    """
    if not value:
        kind = type(value)
        if kind is dict:
            return "{}"
        if kind is list:
            return "[]"
    try:
        text = _encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"{field} must be JSON-serializable: {exc}", field=field) from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):  # rare: find where, to say so
        try:
            validation.json_normalize(value, field)
        except InvalidJob as exc:
            raise InvalidJob(str(exc), field=field) from None
    return text
