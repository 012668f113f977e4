"""Clients, the leader lease, queues and notifications on SQLite."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Sequence

from django_hopper.engine.params import (
    ClientRegisterParams,
    ClientRenewParams,
    ClientRenewResult,
    LeaderParams,
    SchemaState,
)
from django_hopper.engine.sqlite.convert import db_time, dumps, from_db_time, uuid_or_none
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.exceptions import DatabaseError
from django_hopper.types import CHANNEL_LEADER, ClientRow, ControlMessage, QueueLimits, QueueRow


class ClientsMixin(SQLiteSupport):
    """The client, leader, queue and notification half of the engine contract."""

    @translate_errors
    def _schema_state(self) -> SchemaState:
        """Read the newest applied hopper migration and the code floor, without a lock."""
        with self._cursor() as c:
            c.execute(Q["schema_state.exists"], {})
            migrations, floor = c.fetchone()
            if not migrations:
                return SchemaState()
            c.execute(Q["schema_state.floor" if floor else "schema_state"], {})
            version, oldest = c.fetchone()
        return SchemaState(version=int(version), oldest_code=int(oldest))

    @translate_errors
    def _index_valid(self, name: str) -> bool | None:
        with self._cursor() as c:
            c.execute(Q["index_valid"], {"name": name})
            return True if c.fetchone() else None

    def _schema_lock_open(self) -> sqlite3.Connection | None:
        """Open the lock database beside the database file; None for one in memory."""
        name = str(self.connection.settings_dict["NAME"])
        if self.connection.creation.is_in_memory_db(name):
            return None  # no other process can open it: nothing to lock against
        try:
            return sqlite3.connect(f"{name}-hopper-migrate", timeout=0, isolation_level=None)
        except sqlite3.Error as exc:
            raise DatabaseError(
                f"the migration lock could not open {name}-hopper-migrate: {exc}"
            ) from exc

    def _schema_lock_try(self, handle: sqlite3.Connection | None) -> bool:
        if handle is None:
            return True
        try:
            handle.execute(Q["schema_lock"])
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return False
            raise DatabaseError(f"the migration lock: {exc}") from exc
        return True

    def _schema_lock_holder(self, handle: sqlite3.Connection | None) -> str:
        return "another process migrating this database file"

    def _schema_lock_close(self, handle: sqlite3.Connection | None) -> None:
        if handle is None:
            return
        try:
            if handle.in_transaction:
                handle.execute(Q["schema_lock.release"])
        finally:
            handle.close()

    # -- clients ------------------------------------------------------------

    @translate_errors
    def _client_register(self, params: ClientRegisterParams) -> int:
        """Create a client's lease row, expiring ``ttl`` from now; return its ID."""
        now, now_s = self._now(params.now)
        with self._cursor() as c:
            c.execute(
                Q["client_register"],
                {
                    "hostname": params.hostname,
                    "now": now_s,
                    "expires_at": db_time(now + params.ttl),
                    "info": dumps(params.info, "info"),
                },
            )
            return int(c.fetchone()[0])

    @translate_errors
    def _client_renew(self, params: ClientRenewParams) -> ClientRenewResult:
        """Extend an unexpired lease and return the control state the client re-reads."""
        now, now_s = self._now(params.now)
        args = {
            "id": params.client_id,
            "now": now_s,
            "expires_at": db_time(now + params.ttl),
            "completed": None
            if params.completed is None
            else json.dumps({str(k): int(v) for k, v in params.completed.items()}),
        }
        with self._cursor() as c:
            c.execute(Q["client_renew"], args)
            renewed = bool(c.rowcount)
            c.execute(Q["client_renew.control"], args)
            rows = c.fetchall()
        result = ClientRenewResult(renewed=renewed)
        for what, value in rows:
            if what == "cancel":
                job_id = uuid_or_none(value)
                if job_id is not None:
                    result.cancel_requested.append(job_id)
            elif what == "paused":
                result.paused_queues.append(value)
            else:
                result.limited_queues.append(value)
        return result

    @translate_errors
    def _client_delete(self, client_id: int) -> None:
        """Remove a client's lease row."""
        with self._cursor() as c:
            c.execute(Q["client_delete"], {"id": client_id})

    @translate_errors
    def _client_prune_expired(self, now: dt.datetime | None = None) -> int:
        """Delete lease rows that have expired; return how many."""
        _, now_s = self._now(now)
        with self._cursor() as c:
            c.execute(Q["client_prune_expired"], {"now": now_s})
            return int(c.rowcount)

    @translate_errors
    def _client_list(self) -> list[ClientRow]:
        """Return every client lease row, live or expired, in ID order."""
        with self._cursor() as c:
            c.execute(Q["client_list"], {})
            return [
                ClientRow(
                    id=r[0],
                    hostname=r[1],
                    started_at=from_db_time(r[2]),
                    expires_at=from_db_time(r[3]),
                    info=json.loads(r[4]),
                )
                for r in c.fetchall()
            ]

    # -- leader -------------------------------------------------------------

    @translate_errors
    def _leader_attempt(self, params: LeaderParams) -> bool:
        """Take the leader lease if free or expired, or renew it if held."""
        now, now_s = self._now(params.now)
        with self._cursor() as c:
            c.execute(
                Q["leader_attempt"],
                {
                    "client_id": params.client_id,
                    "now": now_s,
                    "expires_at": db_time(now + params.ttl),
                },
            )
            return c.fetchone() is not None

    @translate_errors
    def _leader_resign(self, client_id: int) -> None:
        """Give up the leader lease if held, and signal the others to elect."""
        with self._cursor() as c:
            c.execute(Q["leader_resign"], {"client_id": client_id})
            resigned = bool(c.rowcount)
        if resigned:
            self.notify(CHANNEL_LEADER, [ControlMessage.resigned(client_id).payload()])

    @translate_errors
    def _leader_get(self, now: dt.datetime | None = None) -> int | None:
        """Return the unexpired leader's client ID, or None."""
        _, now_s = self._now(now)
        with self._cursor() as c:
            c.execute(Q["leader_get"], {"now": now_s})
            row = c.fetchone()
        return None if row is None else int(row[0])

    # -- queues -------------------------------------------------------------

    @translate_errors
    def _queue_ensure(self, names: Sequence[str], now: dt.datetime | None = None) -> None:
        """Record queues that are not known yet; leave known ones alone."""
        _, now_s = self._now(now)
        with self._cursor() as c:
            c.execute(Q["queue_ensure"], {"names": json.dumps(list(names)), "now": now_s})

    @translate_errors
    def _queue_list(self) -> list[QueueRow]:
        """Return every known queue with its pause and limits, by name."""
        with self._cursor() as c:
            c.execute(Q["queue_list"], {})
            rows = c.fetchall()
        return [
            QueueRow(
                name=r[0],
                paused_at=from_db_time(r[1]),
                updated_at=from_db_time(r[2]),
                limits=QueueLimits(
                    name=r[0],
                    global_limit=r[3] or 0,
                    rate_per_sec=r[4] or 0.0,
                    rate_burst=r[5] or 0,
                    partition_limit=r[6] or 0,
                    aging=dt.timedelta(microseconds=r[7]) if r[7] else dt.timedelta(0),
                ),
            )
            for r in rows
        ]

    # -- notifications ------------------------------------------------------

    def _notify(self, channel: str, payloads: Sequence[str]) -> None:
        """Do nothing: SQLite has no notifications, and workers poll."""
