"""JSON going into the database, encoded the same way by both engines.

PostgreSQL's ``jsonb`` cannot hold U+0000 and SQLite's JSON text can, so a
NUL anywhere in a value is refused here, naming where it is, instead of one
engine storing it and the other failing with a driver error; so is a lone
surrogate, which has no UTF-8 form (``jsonb`` refuses it).
"""

from __future__ import annotations

import json
import json.encoder
import re
from typing import Any

from django_hopper import validation
from django_hopper.exceptions import InvalidJob

_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _not_json(value: Any) -> Any:
    """Refuse a value JSON has no form for, in ``json``'s own words."""
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: ``_encode``'s C encoder made once, without the per-call set-up of
#: ``JSONEncoder.encode`` (a new C encoder and a markers dict on every call,
#: most of the cost of encoding a job's arguments). It keeps no markers, so a
#: value that contains itself ends in RecursionError rather than ValueError:
#: :func:`dump_json` then encodes that value with ``_encode``, which says why.
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_encode_once: Any = (
    _c_make_encoder(
        None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )
    if _c_make_encoder is not None
    else None
)

#: ``\u0000`` in the encoded text that is an escape of its own: preceded by an
#: even number of backslashes (an odd number makes it the text ``\u0000``).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: A surrogate's escape (``\ud800``-``\udfff``): a pair for a character beyond
#: U+FFFF, or a lone surrogate, which has no UTF-8 form (jsonb refuses it).
_SURROGATE_ESCAPE = re.compile(r"\\ud[89a-f]")


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
        if _encode_once is None:  # pragma: no cover - CPython has the C encoder
            text = _encode(value)
        else:
            try:
                text = "".join(_encode_once(value, 0))
            except RecursionError:
                text = _encode(value)  # a cycle (ValueError) or nesting too deep, as before
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"{field} must be JSON-serializable: {exc}", field=field) from None
    # Rare: find where, to say so. A NUL escape, or a surrogate's: a character
    # beyond U+FFFF is written as two (a pair, kept), a lone surrogate as one.
    if ("\\u0000" in text and _NUL_ESCAPE.search(text)) or (
        "\\ud" in text and _SURROGATE_ESCAPE.search(text)
    ):
        try:
            validation.json_normalize(value, field)
        except InvalidJob as exc:
            raise InvalidJob(str(exc), field=field) from None
    return text
