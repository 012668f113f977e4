"""A new leader runs the services that move jobs at once and holds the live-table
upkeep back."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django_hopper.maintenance import Service
from django_hopper.maintenance.base import UPKEEP_FIRST_DELAY
from django_hopper.maintenance.history import HistoryIndexer, HistoryPruner, Vacuumer
from django_hopper.maintenance.leader import Maintainer
from django_hopper.maintenance.services import (
    Rescuer,
    Scheduler,
    StreamPruner,
    default_services,
)


class Counting(Service):
    """Counts its runs."""

    def __init__(self, name: str, interval: float, first_delay: float = 0.0) -> None:
        super().__init__(engine=None)  # type: ignore[arg-type]
        self.name = name
        self.interval = interval
        self.first_delay = first_delay
        self.runs = 0

    def run_once(self, now: dt.datetime | None = None) -> int:
        self.runs += 1
        return 0


def _maintainer(*services: Service) -> Maintainer:
    return Maintainer(None, None, interval=1.0, services=list(services))  # type: ignore[arg-type]


def test_first_round__runs_job_services_and_holds_upkeep_until_its_first_delay() -> None:
    rescue = Counting("rescue", 1.0)
    upkeep = Counting("upkeep", 30.0, first_delay=10.0)
    m = _maintainer(rescue, upkeep)
    for tick in range(10):  # rounds at 100 s .. 109 s: the first ten seconds of leading
        m.run_services(at=100.0 + tick)
    assert (rescue.runs, upkeep.runs) == (10, 0)
    m.run_services(at=110.0)
    assert (rescue.runs, upkeep.runs) == (11, 1)
    # Then every interval, as any service.
    for tick in range(111, 140):
        m.run_services(at=float(tick))
    assert upkeep.runs == 1
    m.run_services(at=140.0)
    assert upkeep.runs == 2


class Scripted:
    """An elector whose election results are given in advance."""

    def __init__(self, *results: bool) -> None:
        self.results = list(results)

    def run_once(self) -> bool:
        return self.results.pop(0)


def test_leader_elected_again__holds_upkeep_as_a_new_leader_does() -> None:
    rescue = Counting("rescue", 1.0)
    upkeep = Counting("upkeep", 30.0, first_delay=10.0)
    elector: Any = Scripted(*[True] * 11, False, *[True] * 11)
    m = Maintainer(None, elector, interval=1.0, services=[rescue, upkeep])  # type: ignore[arg-type]
    for tick in range(100, 111):  # a first term: upkeep runs once, at 110 s
        m.run_once(at=float(tick))
    assert upkeep.runs == 1
    assert m.run_once(at=500.0) is None  # the term ends; another leader takes over
    for tick in range(1000, 1010):  # elected again long after: upkeep is not due at once
        m.run_once(at=float(tick))
    assert (rescue.runs, upkeep.runs) == (21, 1)
    m.run_once(at=1010.0)
    assert upkeep.runs == 2


def test_forced_round__runs_upkeep_at_once() -> None:
    upkeep = Counting("upkeep", 30.0, first_delay=10.0)
    m = _maintainer(upkeep)
    m.run_services(force=True, at=100.0)
    assert upkeep.runs == 1


def test_default_services__delay_only_the_upkeep_no_job_waits_for() -> None:
    from django_hopper.engine import get_engine

    delayed: dict[type[Any], float] = {
        type(s): s.first_delay for s in default_services(get_engine(), lambda: 1)
    }
    assert {t for t, d in delayed.items() if d} == {Vacuumer, StreamPruner}
    assert delayed[Vacuumer] == delayed[StreamPruner] == UPKEEP_FIRST_DELAY
    # Partitions are made at once: a fresh install's first day is not left in DEFAULT.
    assert delayed[HistoryPruner] == delayed[HistoryIndexer] == 0
    assert delayed[Rescuer] == delayed[Scheduler] == 0
