"""The PostgreSQL listener: LISTEN on a dedicated autocommit connection.

It must not be one of Django's connections: it blocks waiting for
notifications, and a pooled connection would be handed to other work. It
connects with the settings of the alias's session connection
(:func:`django_hopper.topology.session_alias`): the direct connection named by
``HOPPER["DIRECT_DATABASES"]`` when there is one, since a transaction pooler
gives a client no session to LISTEN on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections
from psycopg import sql

from django_hopper.engine.base import Listener
from django_hopper.engine.postgres.support import QUERIES, db_errors
from django_hopper.exceptions import DatabaseError, InvalidJob, NotSupported
from django_hopper.types import Notification

#: Django's connection parameters that configure its own cursors, not the server.
_DJANGO_ONLY = ("cursor_factory", "context", "pool", "server_side_binding", "assume_role")


def open_listener(alias: str) -> PostgresListener:
    """Open a listener for the database of ``alias``, through its session connection.

    Raises NotSupported when the alias is behind a transaction pooler with no
    direct connection configured: the caller polls instead.
    """
    session, params = _session(
        alias,
        f"database {alias!r} is behind a transaction pooler and "
        "HOPPER['DIRECT_DATABASES'] names no direct connection for it: poll instead",
    )
    return PostgresListener(params, alias=session)


def _session(alias: str, refusal: str) -> tuple[str, dict[str, Any]]:
    """Return the alias that gives ``alias``'s database a session (itself, or its
    direct connection behind a transaction pooler) and that alias's connection
    parameters; raise NotSupported with ``refusal`` where there is none."""
    from django_hopper.topology import session_alias  # noqa: PLC0415 - import cycle: topology imports the postgres engine

    session = session_alias(alias)
    if session is None:
        raise NotSupported(refusal)
    with db_errors():
        return session, connections[session].get_connection_params()


def open_session(alias: str, purpose: str) -> psycopg.Connection[Any]:
    """Open a dedicated autocommit connection to the database of ``alias``, with a session.

    Session-level state (an advisory lock) must stay on one server
    connection, which a transaction pooler does not give: behind one, the
    direct connection of ``HOPPER["DIRECT_DATABASES"]`` is used, and without
    it this refuses, naming ``purpose``. The direct connection is used for
    its route (host, port, credentials) only: the database is ``alias``'s,
    by name, so the session reaches the database ``alias`` works on even
    where a test runner renamed ``alias``'s database and not the direct one's.
    """
    session, params = _session(
        alias,
        f"{purpose} needs a session on database {alias!r}, which is behind a "
        "transaction pooler: name its direct connection in HOPPER['DIRECT_DATABASES']",
    )
    conninfo = {k: v for k, v in params.items() if k not in _DJANGO_ONLY}
    name = connections[alias].settings_dict.get("NAME")
    if session != alias and name:
        conninfo["dbname"] = name
    try:
        return psycopg.connect(autocommit=True, **conninfo)
    except psycopg.Error as exc:
        raise DatabaseError(f"{purpose} could not connect: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ConnectionRoute:
    """Where a connection goes: the port the client dialled and the one the server has."""

    #: The host the client connected to (a directory for a Unix socket).
    host: str
    #: The port the client connected to.
    client_port: int
    #: The port the server listens on; None when it was reached over a Unix socket.
    server_port: int | None

    @property
    def proxied(self) -> bool:
        """Whether a proxy sits between: a TCP client whose server has another port."""
        if self.host.startswith("/"):
            return False
        return self.server_port != self.client_port

    def __str__(self) -> str:
        server = "a Unix socket" if self.server_port is None else f"port {self.server_port}"
        return f"client port {self.client_port}, server on {server}"


class PostgresListener(Listener):
    """A connection that receives notifications; a lost one raises DatabaseError."""

    def __init__(self, params: Mapping[str, Any], *, alias: str | None = None) -> None:
        #: The Django alias whose settings it connected with.
        self.alias = alias
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
