"""The leader's periodic and retention services (issue 6).

Each service has ``run_once(now=None)``, which does one pass and returns what
it did, so tests call it directly with an injected clock and the leader loop
(``django_hopper.maintenance``) calls it every ``interval``. Only the leader
runs them, but each is safe on two leaders at once: the engine methods they
call are atomic (``periodic_insert``) or idempotent (``history_*``).

* :class:`PeriodicEnqueuer` — registers this client's periodic jobs and
  inserts the job of every due slot (every maintenance interval).
* :class:`HistoryRetention` — creates history partitions ahead, drops or
  prunes what is past retention (every few minutes).
* :class:`HistoryIndexer` — builds history indexes per partition without
  blocking (rarely; it can take long, so apart from the other duties).
* :class:`JobsUpkeep` — vacuums / analyzes the hot tables when they need it.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import ClassVar

from django_hopper import periodic
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    HistoryIndexParams,
    HistoryIndexResult,
    HistoryMaintainParams,
    HistoryMaintainResult,
    JobsMaintainParams,
    JobsMaintainResult,
    PeriodicInsertParams,
    PeriodicRegisterParams,
)
from django_hopper.exceptions import HopperError
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
    #: Whether this pass (re)registered this client's definitions.
    registered: bool = False


class PeriodicEnqueuer:
    """Insert the job of every due periodic slot, once per slot across leaders.

    A pass registers this client's own definitions (when they changed, or
    every ``register_every``), then schedules from the registrations of all
    live clients: per name, the newest client's definition wins, so during a
    rolling deploy the new schedule takes over as soon as a new client is up.
    """

    interval: ClassVar[dt.timedelta] = dt.timedelta(seconds=1)
    register_every: ClassVar[dt.timedelta] = dt.timedelta(minutes=1)

    def __init__(
        self,
        engine: BaseEngine,
        client_id: int,
        definitions: list[periodic.PeriodicDefinition] | None = None,
    ) -> None:
        self.engine = engine
        self.contract = engine
        self.client_id = client_id
        #: None: read ``periodic.definitions()`` on each pass (code and settings).
        self._definitions = definitions
        self._registered_digests: tuple[str, ...] | None = None
        self._registered_at: dt.datetime | None = None

    def run_once(self, now: dt.datetime | None = None) -> PeriodicRunResult:
        """Register, then insert the due slots; return what was inserted."""
        now = now or self.engine.now()
        result = PeriodicRunResult(registered=self.register(now))
        registrations = self.contract.periodic_registrations(now=now)
        last_slots = self.contract.periodic_last_slots()
        for row in _newest_per_name(registrations):
            try:
                definition = periodic.PeriodicDefinition.from_json(row.definition)
                slot = periodic.due_slot(
                    definition.schedule,
                    last_slot=last_slots.get(row.name),
                    now=now,
                    catch_up=definition.catch_up,
                    grace=definition.grace,
                )
                if slot is None:
                    continue
                job, inserted = self.contract.periodic_insert(
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

    def register(self, now: dt.datetime) -> bool:
        """Register this client's definitions if they changed or are due a refresh."""
        definitions = self._definitions
        if definitions is None:
            definitions = periodic.definitions()
        registrations = [d.registration() for d in definitions]
        digests = tuple(r.digest for r in registrations)
        fresh = self._registered_at is not None and now - self._registered_at < self.register_every
        if digests == self._registered_digests and fresh:
            return False
        self.contract.periodic_register(
            PeriodicRegisterParams(client_id=self.client_id, registrations=registrations, now=now)
        )
        self._registered_digests = digests
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


class HistoryRetention:
    """Keep history bounded: partitions ahead, drops and prunes past retention.

    Retention comes from ``HOPPER["COMPLETED_RETENTION"]`` and
    ``["FAILED_RETENTION"]`` (seconds) unless given.
    """

    interval: ClassVar[dt.timedelta] = dt.timedelta(minutes=5)

    def __init__(
        self,
        engine: BaseEngine,
        *,
        completed_retention: dt.timedelta | None = None,
        failed_retention: dt.timedelta | None = None,
        lock_timeout: dt.timedelta = dt.timedelta(0),
        create_ahead: int = 3,
    ) -> None:
        self.engine = engine
        self.contract = engine
        self.completed_retention = completed_retention
        self.failed_retention = failed_retention
        self.lock_timeout = lock_timeout
        self.create_ahead = create_ahead

    def params(self, now: dt.datetime | None = None, **overrides: object) -> HistoryMaintainParams:
        """Return the params of a pass (``hopper_partitions`` overrides some)."""
        from django_hopper.conf import hopper_settings

        values: dict[str, object] = {
            "completed_retention": self.completed_retention
            or hopper_settings.seconds("COMPLETED_RETENTION"),
            "failed_retention": self.failed_retention
            or hopper_settings.seconds("FAILED_RETENTION"),
            "lock_timeout": self.lock_timeout,
            "create_ahead": self.create_ahead,
            "now": now,
        }
        values.update(overrides)
        return HistoryMaintainParams(**values)  # type: ignore[arg-type]

    def run_once(self, now: dt.datetime | None = None) -> HistoryMaintainResult:
        """Do one retention pass; deferred units are retried by the next one."""
        result = self.contract.history_maintain(self.params(now))
        if result.deferred:
            logger.info("history retention deferred %s (locked); retrying later", result.deferred)
        return result


class HistoryIndexer:
    """Build history indexes that partitions lack, concurrently (PostgreSQL).

    It needs a connection outside any transaction and can run long, so the
    leader runs it apart from its other duties (its own thread, rarely).
    """

    interval: ClassVar[dt.timedelta] = dt.timedelta(minutes=10)

    def __init__(self, engine: BaseEngine, params: HistoryIndexParams | None = None) -> None:
        self.engine = engine
        self.contract = engine
        self.params = params or HistoryIndexParams()

    def run_once(self, now: dt.datetime | None = None) -> HistoryIndexResult:
        """Do one pass; engines without partitions have nothing to build."""
        if not self.engine.features.supports_history_partitions:
            return HistoryIndexResult()
        return self.contract.history_index(self.params)


class JobsUpkeep:
    """Vacuum and analyze the live tables between autovacuum runs (PostgreSQL)."""

    interval: ClassVar[dt.timedelta] = dt.timedelta(seconds=30)

    def __init__(self, engine: BaseEngine, params: JobsMaintainParams | None = None) -> None:
        self.engine = engine
        self.contract = engine
        self.params = params or JobsMaintainParams()

    def run_once(self, now: dt.datetime | None = None) -> JobsMaintainResult:
        """Do one pass; it never waits for a lock."""
        return self.contract.jobs_maintain(self.params)
