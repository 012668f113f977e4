"""Periodic slots and registrations on SQLite.

SQLite has one writer at a time, so the transaction that records a slot and
inserts its job holds off every other leader until it commits; the slot's
conditional upsert (``WHERE last_slot < slot``) then makes the second leader's
attempt a no-op. The job is inserted by ``job_insert_many``, so the core
insert SQL is written once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django_hopper.engine.params import (
    JobInsertOpts,
    PeriodicDisableParams,
    PeriodicEnableParams,
    PeriodicInsertParams,
    PeriodicRegisterParams,
)
from django_hopper.engine.sqlite.convert import db_time, dumps, from_db_time
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, translate_errors
from django_hopper.ids import new_id
from django_hopper.types import JobRow, PeriodicRegistrationRow, PeriodicSlotRow


def slot_from_row(r: Sequence[Any]) -> PeriodicSlotRow:
    """Build a PeriodicSlotRow from (name, last_slot, job_id, inserted_at, disabled_at,
    enabled_at), as SQLite stores them (times as text, the ID as hex)."""
    return PeriodicSlotRow(
        name=r[0],
        last_slot=from_db_time(r[1]) if r[1] is not None else None,
        job_id=uuid.UUID(r[2]) if r[2] is not None else None,
        inserted_at=from_db_time(r[3]) if r[3] is not None else None,
        disabled_at=from_db_time(r[4]) if r[4] is not None else None,
        enabled_at=from_db_time(r[5]) if r[5] is not None else None,
    )


class SQLitePeriodicMixin(SQLiteSupport):
    """``periodic_*`` methods of the SQLite engine."""

    @translate_errors
    def _periodic_insert(self, params: PeriodicInsertParams) -> tuple[JobRow | None, bool]:
        """Record the slot if it is new, then insert its job, in one transaction."""
        now, now_text = self._now(params.now)
        job = params.job
        if job.id is None:
            job = dataclasses.replace(job, id=new_id())
        assert job.id is not None
        with self._atomic(), self._cursor() as cursor:
            cursor.execute(
                Q["periodic_insert"],
                {
                    "name": params.name,
                    "slot": db_time(params.slot, "slot"),
                    "job_id": job.id.hex,
                    "now": now_text,
                },
            )
            if cursor.fetchone() is None:
                return None, False
            (result,) = self.job_insert_many([job], JobInsertOpts(notify=True, now=now))
            if result.duplicate:
                cursor.execute(
                    Q["periodic_insert.job_id"],
                    {"name": params.name, "job_id": result.job.id.hex},
                )
                return result.job, False
            return result.job, True

    @translate_errors
    def _periodic_last_slots(self) -> dict[str, dt.datetime]:
        """Return the last recorded slot per periodic job."""
        with self._cursor() as cursor:
            cursor.execute(Q["periodic_last_slots"], {})
            return {name: from_db_time(slot) for name, slot in cursor.fetchall()}

    @translate_errors
    def _periodic_register(self, params: PeriodicRegisterParams) -> None:
        """Replace the client's registrations, atomically, if its lease is live."""
        _, now_text = self._now(params.now)
        registrations = dumps(
            [
                {"name": r.name, "definition": r.definition, "digest": r.digest}
                for r in params.registrations
            ],
            "registrations",
        )
        args = {"client_id": params.client_id, "now": now_text}
        with self._atomic(), self._cursor() as cursor:
            cursor.execute(Q["periodic_register"], args)
            live = cursor.fetchone() is not None
            cursor.execute(Q["periodic_register.delete"], args)
            if live and params.registrations:
                cursor.execute(
                    Q["periodic_register.insert"], {**args, "registrations": registrations}
                )

    @translate_errors
    def _periodic_registrations(
        self, now: dt.datetime | None = None
    ) -> list[PeriodicRegistrationRow]:
        """Return the registrations of live clients, newest client first per name."""
        _, now_text = self._now(now)
        with self._cursor() as cursor:
            cursor.execute(Q["periodic_registrations"], {"now": now_text})
            rows = cursor.fetchall()
        return [
            PeriodicRegistrationRow(
                name=name,
                definition=json.loads(definition),
                digest=digest,
                client_id=client_id,
                client_started_at=from_db_time(started_at),  # type: ignore[arg-type]
                registered_at=from_db_time(registered_at),  # type: ignore[arg-type]
            )
            for name, definition, digest, client_id, started_at, registered_at in rows
        ]

    @translate_errors
    def _periodic_list(self) -> list[PeriodicSlotRow]:
        """Return every recorded periodic state, by name."""
        with self._cursor() as cursor:
            cursor.execute(Q["periodic_list"], {})
            return [slot_from_row(r) for r in cursor.fetchall()]

    @translate_errors
    def _periodic_disable(self, params: PeriodicDisableParams) -> PeriodicSlotRow:
        """Upsert disabled_at, keeping an earlier one."""
        _, now_text = self._now(params.now)
        with self._atomic(), self._cursor() as cursor:
            cursor.execute(Q["periodic_disable"], {"name": params.name, "now": now_text})
            return slot_from_row(cursor.fetchone())

    @translate_errors
    def _periodic_enable(self, params: PeriodicEnableParams) -> PeriodicSlotRow:
        """Clear disabled_at; record enabled_at if it was disabled."""
        _, now_text = self._now(params.now)
        with self._atomic(), self._cursor() as cursor:
            cursor.execute(Q["periodic_enable"], {"name": params.name, "now": now_text})
            return slot_from_row(cursor.fetchone())
