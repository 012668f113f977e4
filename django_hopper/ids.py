"""Time-ordered job IDs (UUIDv7): ID order is creation order, and IDs can be made anywhere."""

from __future__ import annotations

import uuid

import uuid_utils

_new = object.__new__
_set = object.__setattr__
_UUID = uuid.UUID
_SAFE_UNKNOWN = uuid.SafeUUID.unknown
_from_bytes = int.from_bytes


def uuid_from_int(value: int) -> uuid.UUID:
    """Return ``uuid.UUID(int=value)`` without its constructor's argument checks.

    For a value read from exactly 16 bytes (a new ID's, a stored ID's), which
    is always in range: the constructor's checks cost more than making the ID.
    """
    made = _new(_UUID)
    _set(made, "int", value)
    _set(made, "is_safe", _SAFE_UNKNOWN)
    return made


def new_id() -> uuid.UUID:
    """Return a new UUIDv7 as a standard ``uuid.UUID``."""
    return uuid_from_int(_from_bytes(uuid_utils.uuid7().bytes))


def new_ids(n: int) -> list[uuid.UUID]:
    """Return ``n`` new, increasing UUIDv7s."""
    make = uuid_utils.uuid7
    return [uuid_from_int(_from_bytes(make().bytes)) for _ in range(n)]
