"""The PostgreSQL listener: LISTEN on a dedicated autocommit connection.

It must not be one of Django's connections: it blocks waiting for
notifications, and a pooled connection would be handed to other work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from django_hopper.engine.base import Listener, Notification
from django_hopper.engine.postgres.support import QUERIES
from django_hopper.exceptions import DatabaseError, InvalidJob

#: Django's connection parameters that configure its own cursors, not the server.
_DJANGO_ONLY = ("cursor_factory", "context", "pool", "server_side_binding", "assume_role")


class PostgresListener(Listener):
    """A connection that receives notifications; a lost one raises DatabaseError."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        conninfo = {k: v for k, v in params.items() if k not in _DJANGO_ONLY}
        try:
            self._conn: psycopg.Connection[Any] = psycopg.connect(autocommit=True, **conninfo)
        except psycopg.Error as exc:
            raise DatabaseError(f"the listener could not connect: {exc}") from exc
        self._channels: set[str] = set()

    def listen(self, channels: Sequence[str]) -> None:
        """Subscribe to channels (quoted as identifiers, so any name is safe)."""
        for channel in channels:
            if not isinstance(channel, str) or not channel:
                raise InvalidJob(f"channel must be a non-empty string, not {channel!r}")
            if channel in self._channels:
                continue
            statement = sql.SQL(QUERIES["listener.listen"]).format(channel=sql.Identifier(channel))
            try:
                self._conn.execute(statement)
            except psycopg.Error as exc:
                raise DatabaseError(f"LISTEN {channel} failed: {exc}") from exc
            self._channels.add(channel)

    def next(self, timeout: float) -> list[Notification]:
        """Wait up to ``timeout`` seconds for a notification; return it and any queued behind it."""
        try:
            got = [
                Notification(channel=n.channel, payload=n.payload)
                for n in self._conn.notifies(timeout=max(timeout, 0.0), stop_after=1)
            ]
            if got:
                got.extend(
                    Notification(channel=n.channel, payload=n.payload)
                    for n in self._conn.notifies(timeout=0.0)
                )
        except psycopg.Error as exc:
            raise DatabaseError(f"the listener lost its connection: {exc}") from exc
        return got

    def close(self) -> None:
        """Release the connection; closing twice is harmless."""
        try:
            self._conn.close()
        except psycopg.Error:  # pragma: no cover - closing a broken socket
            pass
