"""Periodic slots and registrations on PostgreSQL.

A slot is recorded with a conditional upsert of ``hopper_periodic_slot``
(``ON CONFLICT ... DO UPDATE ... WHERE last_slot < slot``) before the job is
inserted by ``job_insert_many`` in the same transaction. A second leader
inserting the same slot waits on the row the first one wrote, then finds the
condition false: a slot produces at most one job, and the core insert SQL is
written once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django_hopper.engine.params import (
    JobInsertOpts,
    PeriodicDisableParams,
    PeriodicEnableParams,
    PeriodicInsertParams,
    PeriodicRegisterParams,
)
from django_hopper.engine.postgres.convert import dump_json, load_json
from django_hopper.engine.postgres.support import PostgresSupport
from django_hopper.ids import new_id
from django_hopper.types import JobRow, PeriodicRegistrationRow, PeriodicSlotRow


def slot_from_row(r: Sequence[Any]) -> PeriodicSlotRow:
    """Build a PeriodicSlotRow from (name, last_slot, job_id, inserted_at, disabled_at,
    enabled_at)."""
    return PeriodicSlotRow(
        name=r[0],
        last_slot=r[1],
        job_id=r[2],
        inserted_at=r[3],
        disabled_at=r[4],
        enabled_at=r[5],
    )


class PostgresPeriodicMixin(PostgresSupport):
    """``periodic_*`` methods of the PostgreSQL engine."""

    def _periodic_insert(self, params: PeriodicInsertParams) -> tuple[JobRow | None, bool]:
        """Record the slot if it is new, then insert its job, in one transaction.

        The job's ID is chosen first so that the slot row names it from the
        start; a unique-key duplicate repoints the slot at the existing job.
        """
        job = (
            params.job
            if params.job.id is not None
            else dataclasses.replace(params.job, id=new_id())
        )
        with self._atomic():
            recorded = self._fetchone(
                "periodic_insert",
                {"name": params.name, "slot": params.slot, "job_id": job.id, "now": params.now},
            )
            if recorded is None:
                return None, False
            (result,) = self.job_insert_many([job], JobInsertOpts(notify=True, now=params.now))
            if result.duplicate:
                self._execute(
                    "periodic_insert.job_id", {"name": params.name, "job_id": result.job.id}
                )
                return result.job, False
            return result.job, True

    def _periodic_last_slots(self) -> dict[str, dt.datetime]:
        """Return the last recorded slot per periodic job."""
        return {name: slot for name, slot in self._fetchall("periodic_last_slots", {})}

    def _periodic_register(self, params: PeriodicRegisterParams) -> None:
        """Replace the client's registrations, atomically, if its lease is live.

        The client's row is share-locked first, so a prune deleting it waits
        for this transaction (and then finds the rows gone with it through the
        cleanup every call does).
        """
        registrations = dump_json(
            [
                {"name": r.name, "definition": r.definition, "digest": r.digest}
                for r in params.registrations
            ],
            "registrations",
        )
        args = {"client_id": params.client_id, "now": params.now}
        with self._atomic():
            live = self._fetchone("periodic_register", args)
            self._execute("periodic_register.delete", args)
            if live is not None and params.registrations:
                self._execute("periodic_register.insert", {**args, "registrations": registrations})

    def _periodic_registrations(
        self, now: dt.datetime | None = None
    ) -> list[PeriodicRegistrationRow]:
        """Return the registrations of live clients, newest client first per name."""
        return [
            PeriodicRegistrationRow(
                name=name,
                definition=load_json(definition),
                digest=digest,
                client_id=client_id,
                client_started_at=started_at,
                registered_at=registered_at,
            )
            for name, definition, digest, client_id, started_at, registered_at in self._fetchall(
                "periodic_registrations", {"now": now}
            )
        ]

    def _periodic_list(self) -> list[PeriodicSlotRow]:
        """Return every recorded periodic state, by name."""
        return [slot_from_row(r) for r in self._fetchall("periodic_list", {})]

    def _periodic_disable(self, params: PeriodicDisableParams) -> PeriodicSlotRow:
        """Upsert disabled_at, keeping an earlier one."""
        row = self._fetchone("periodic_disable", {"name": params.name, "now": params.now})
        assert row is not None
        return slot_from_row(row)

    def _periodic_enable(self, params: PeriodicEnableParams) -> PeriodicSlotRow:
        """Clear disabled_at; record enabled_at if it was disabled."""
        row = self._fetchone("periodic_enable", {"name": params.name, "now": params.now})
        assert row is not None
        return slot_from_row(row)
