"""The leader's periodic-job service: one job per due slot, across leaders."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django_hopper import periodic
from django_hopper.engine.params import PeriodicInsertParams, PeriodicRegisterParams
from django_hopper.exceptions import HopperError
from django_hopper.maintenance.base import Service

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import PeriodicRegistrationRow

logger = logging.getLogger("django_hopper.periodic")


@dataclass(slots=True)
class InsertedSlot:
    name: str
    slot: dt.datetime
    job_id: object


@dataclass(slots=True)
class PeriodicRunResult:
    """What one pass of the enqueuer did."""

    #: Slots whose job this pass inserted.
    inserted: list[InsertedSlot] = field(default_factory=list)
    #: Names whose due slot another leader had already inserted.
    raced: list[str] = field(default_factory=list)
    #: Names whose registration could not be read or inserted (logged).
    failed: list[str] = field(default_factory=list)
    #: Names an operator disabled: none of their slots is inserted.
    disabled: list[str] = field(default_factory=list)
    #: Whether this pass (re)registered this client's definitions.
    registered: bool = False


class PeriodicEnqueuer(Service):
    """Insert the job of every due periodic slot, once per slot across leaders.

    Every client registers its own definitions (:meth:`register`, called from
    the worker's heartbeat, when they changed and every ``register_every``
    seconds); only the leader inserts slots (:meth:`run_once`). It schedules
    from the registrations of all live clients: per name, the newest client's
    definition wins, so during a rolling deploy the new schedule takes over as
    soon as a new client is up.

    ``client_id`` is the client's ID, or a callable returning the current one
    (a fenced worker registers again under a new ID); ``definitions`` default
    to :func:`django_hopper.periodic.definitions`, read on each pass (code and
    settings).
    """

    name = "periodic"
    interval = 1.0
    #: Seconds after which a client registers its unchanged definitions again.
    register_every = 60.0

    def __init__(
        self,
        engine: BaseEngine,
        client_id: int | Callable[[], int | None],
        definitions: list[periodic.PeriodicDefinition] | None = None,
    ) -> None:
        super().__init__(engine)
        self._client_id = client_id
        self._definitions = definitions
        self._registered: tuple[int, tuple[str, ...]] | None = None
        self._registered_at: dt.datetime | None = None

    @property
    def client_id(self) -> int | None:
        """Return the client the definitions are registered under now."""
        cid = self._client_id
        return cid() if callable(cid) else cid

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Register, then insert the due slots; return how many jobs were inserted."""
        return len(self.enqueue(now).inserted)

    def enqueue(self, now: dt.datetime | None = None) -> PeriodicRunResult:
        """Register, then insert the due slots; return what was inserted and what raced."""
        if self.client_id is None:
            return PeriodicRunResult()
        now = now or self.engine.now()
        result = PeriodicRunResult(registered=self.register(now))
        registrations = self.engine.periodic_registrations(now=now)
        states = {s.name: s for s in self.engine.periodic_list()}
        for row in _newest_per_name(registrations):
            state = states.get(row.name)
            if state is not None and state.disabled_at is not None:
                result.disabled.append(row.name)
                continue
            try:
                definition = periodic.PeriodicDefinition.from_json(row.definition)
                slot = periodic.due_slot(
                    definition.schedule,
                    # Slots before an enable fell while disabled: settled, not caught up.
                    last_slot=state.settled if state is not None else None,
                    now=now,
                    catch_up=definition.catch_up,
                    grace=definition.grace,
                )
                if slot is None:
                    continue
                job, inserted = self.engine.periodic_insert(
                    PeriodicInsertParams(
                        name=row.name,
                        slot=slot,
                        job=periodic.job_params(row.definition, row.name, slot),
                        now=now,
                    )
                )
            except HopperError:
                logger.exception("periodic job %r: could not insert its due slot", row.name)
                result.failed.append(row.name)
                continue
            if inserted and job is not None:
                result.inserted.append(InsertedSlot(row.name, slot, job.id))
            else:
                result.raced.append(row.name)
        return result

    def register(self, now: dt.datetime | None = None) -> bool:
        """Register this client's definitions if they changed or are due a refresh."""
        cid = self.client_id
        if cid is None:
            return False
        now = now or self.engine.now()
        definitions = self._definitions
        if definitions is None:
            definitions = periodic.definitions()
        registrations = [d.registration() for d in definitions]
        key = (cid, tuple(r.digest for r in registrations))
        fresh = (
            self._registered_at is not None
            and (now - self._registered_at).total_seconds() < self.register_every
        )
        if key == self._registered and fresh:
            return False
        self.engine.periodic_register(
            PeriodicRegisterParams(client_id=cid, registrations=registrations, now=now)
        )
        self._registered = key
        self._registered_at = now
        return True


def _newest_per_name(rows: list[PeriodicRegistrationRow]) -> list[PeriodicRegistrationRow]:
    """Keep, per name, the registration of the most recently started client."""
    best: dict[str, PeriodicRegistrationRow] = {}
    for row in rows:
        current = best.get(row.name)
        if current is None or (row.client_started_at, row.client_id) > (
            current.client_started_at,
            current.client_id,
        ):
            best[row.name] = row
    return [best[name] for name in sorted(best)]
