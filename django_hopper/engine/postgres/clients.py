"""Clients, leader, queues, time and notifications of the PostgreSQL engine."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from django_hopper.engine.base import Listener
from django_hopper.engine.params import (
    ClientRegisterParams,
    ClientRenewParams,
    ClientRenewResult,
    LeaderParams,
    SchemaState,
)
from django_hopper.engine.postgres import convert
from django_hopper.engine.postgres.listener import open_session
from django_hopper.engine.postgres.support import QUERIES, PostgresSupport
from django_hopper.exceptions import DatabaseError
from django_hopper.types import CHANNEL_LEADER, ClientRow, ControlMessage, QueueRow


def _completed_json(completed: Mapping[str, int] | None) -> str | None:
    """Encode a renewal's completions report, or None to keep the last one."""
    if completed is None:
        return None
    return convert.dump_json({str(k): int(v) for k, v in completed.items()}, "completed")


class ClientsMixin(PostgresSupport):
    """Every non-job method of the contract."""

    # -- time and schema --------------------------------------------------------

    def now(self) -> dt.datetime:
        """Return the database clock: ``now()``, the time the transaction began."""
        row = self._fetchone("now", {})
        if row is None:  # pragma: no cover - SELECT now() always returns a row
            raise DatabaseError("SELECT now() returned nothing")
        return row[0].astimezone(dt.UTC)  # type: ignore[no-any-return]

    def _schema_state(self) -> SchemaState:
        """Read the newest applied hopper migration and the code floor, without a lock."""
        exists = self._fetchone("schema_state.exists", {})
        if not exists or not exists[0]:
            return SchemaState()
        row = self._fetchone("schema_state.floor" if exists[1] else "schema_state", {})
        return SchemaState(version=int(row[0]), oldest_code=int(row[1])) if row else SchemaState()

    def _index_valid(self, name: str) -> bool | None:
        row = self._fetchone("index_valid", {"name": name})
        return None if row is None else bool(row[0])

    def _schema_lock_open(self) -> psycopg.Connection[Any]:
        return open_session(self.alias, "the migration lock")

    def _schema_lock_try(self, handle: psycopg.Connection[Any]) -> bool:
        try:
            row = handle.execute(QUERIES["schema_lock"]).fetchone()
        except psycopg.Error as exc:
            raise DatabaseError(f"the migration lock: {exc}") from exc
        return bool(row and row[0])

    def _schema_lock_holder(self, handle: psycopg.Connection[Any]) -> str:
        try:
            row = handle.execute(QUERIES["schema_lock.holder"]).fetchone()
        except psycopg.Error as exc:
            raise DatabaseError(f"the migration lock: {exc}") from exc
        if row is None:
            return "another session (it just released it)"
        pid, client, application, started = row
        who = f"backend pid {pid} from {client}"
        if application:
            who += f" ({application})"
        return f"{who}, connected since {started:%Y-%m-%d %H:%M:%S %Z}"

    def _schema_lock_close(self, handle: psycopg.Connection[Any]) -> None:
        try:
            # Closing the session releases the lock too; unlocking first says so
            # at once even if the close is slow.
            handle.execute(QUERIES["schema_lock.release"])
        except psycopg.Error:
            pass
        finally:
            handle.close()

    # -- clients ----------------------------------------------------------------

    def _client_register(self, params: ClientRegisterParams) -> int:
        """Create a client's lease row and return its ID."""
        row = self._fetchone(
            "client_register",
            {
                "hostname": params.hostname,
                "ttl": params.ttl,
                "info": convert.dump_json(params.info, "info"),
                "now": params.now,
            },
        )
        assert row is not None
        return int(row[0])

    def _client_renew(self, params: ClientRenewParams) -> ClientRenewResult:
        """Extend an unexpired lease and read the control state, in one statement."""
        row = self._fetchone(
            "client_renew",
            {
                "client_id": params.client_id,
                "ttl": params.ttl,
                "completed": _completed_json(params.completed),
                "now": params.now,
            },
            prepare=True,
        )
        assert row is not None
        return ClientRenewResult(
            renewed=bool(row[0]),
            cancel_requested=list(row[1]),
            paused_queues=list(row[2]),
            limited_queues=list(row[3]),
        )

    def _client_delete(self, client_id: int) -> None:
        """Remove a client's lease row."""
        self._execute("client_delete", {"client_id": client_id})

    def _client_prune_expired(self, now: dt.datetime | None = None) -> int:
        """Remove expired lease rows and return how many."""
        return self._execute("client_prune_expired", {"now": now})

    def _client_list(self) -> list[ClientRow]:
        """Return every lease row, live or expired."""
        return [convert.client_from_row(row) for row in self._fetchall("client_list", {})]

    # -- leader -----------------------------------------------------------------

    def _leader_attempt(self, params: LeaderParams) -> bool:
        """Take or renew the leader lease in one upsert."""
        row = self._fetchone(
            "leader_attempt",
            {"client_id": params.client_id, "ttl": params.ttl, "now": params.now},
        )
        return row is not None

    def _leader_resign(self, client_id: int) -> None:
        """Drop the lease if held, and signal an election, in one statement."""
        payload = ControlMessage.resigned(client_id).payload()
        self._fetchall(
            "leader_resign",
            {"client_id": client_id, "channel": CHANNEL_LEADER, "payload": payload},
        )

    def _leader_get(self, now: dt.datetime | None = None) -> int | None:
        """Return the unexpired leader's client ID, or None."""
        row = self._fetchone("leader_get", {"now": now})
        return int(row[0]) if row else None

    # -- queues -----------------------------------------------------------------

    def _queue_ensure(self, names: Sequence[str], now: dt.datetime | None = None) -> None:
        """Record queues a client works, so they are listed before any job arrives."""
        self._execute("queue_ensure", {"names": names, "now": now})

    def _queue_list(self) -> list[QueueRow]:
        """Return every known queue."""
        return [convert.queue_from_row(row) for row in self._fetchall("queue_list", {})]

    # -- notifications ----------------------------------------------------------

    def _notify(self, channel: str, payloads: Sequence[str]) -> None:
        """Send one notification per payload, delivered when the transaction commits."""
        self._fetchone("notify", {"channel": channel, "payloads": list(payloads)})

    def listener(self) -> Listener:
        """Open a dedicated connection (never Django's) that LISTENs for notifications."""
        # Imported on use: only a process that listens needs the listener's module.
        from django_hopper.engine.postgres.listener import open_listener  # noqa: PLC0415 - import cycle: listener imports the postgres engine

        return open_listener(self.alias)
