"""Time-ordered job IDs (UUIDv7): ID order is creation order, and IDs can be made anywhere."""

from __future__ import annotations

import uuid

import uuid_utils


def new_id() -> uuid.UUID:
    """Return a new UUIDv7 as a standard ``uuid.UUID``."""
    return uuid.UUID(bytes=uuid_utils.uuid7().bytes)


def new_ids(n: int) -> list[uuid.UUID]:
    """Return ``n`` new, increasing UUIDv7s."""
    make = uuid_utils.uuid7
    return [uuid.UUID(bytes=make().bytes) for _ in range(n)]
