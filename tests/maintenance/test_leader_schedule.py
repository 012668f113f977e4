"""The leader loop keeps to a schedule: real leaders insert every 1-second slot once."""

from __future__ import annotations

import collections
import datetime as dt
import itertools
import threading
import time

import pytest
from django.db import connections

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from django_hopper.maintenance import PeriodicEnqueuer, Service
from django_hopper.maintenance.leader import Elector, Maintainer, next_tick
from django_hopper.periodic import register_periodic, unregister_periodic
from tests.maintenance.conftest import register_client

KIND = "tests.leader_tick"


class SlowService(Service):
    """A service that takes 0.3 s each round, as a rescue or a retention pass may."""

    name = "slow"
    interval = 0.0

    def run_once(self, now: dt.datetime | None = None) -> int:
        time.sleep(0.3)
        return 0


def test_next_tick__keeps_the_schedule_and_skips_ticks_a_long_round_missed() -> None:
    assert next_tick(10.0, 1.0, now=10.3) == 11.0
    assert next_tick(10.0, 1.0, now=12.5) == 13.0


@pytest.mark.django_db(transaction=True)
def test_two_real_leaders_insert_each_1_second_slot_exactly_once_across_a_handover(
    tx_engine: BaseEngine,
) -> None:
    register_periodic(KIND, every=dt.timedelta(seconds=1), name="leader-tick")
    try:
        now = tx_engine.now()
        clients = [register_client(tx_engine, now) for _ in range(2)]
        stops = [threading.Event() for _ in clients]
        maintainers = []
        for cid in clients:
            elector = Elector(tx_engine, lambda cid=cid: cid, ttl=15.0)
            services: list[Service] = [
                SlowService(tx_engine),
                PeriodicEnqueuer(tx_engine, lambda cid=cid: cid),
            ]
            maintainers.append(Maintainer(tx_engine, elector, interval=1.0, services=services))

        def loop(maintainer: Maintainer, stop: threading.Event) -> None:
            try:
                maintainer.run(stop)
            finally:
                maintainer.elector.resign()
                connections.close_all()

        def slots() -> list[dt.datetime]:
            jobs = tx_engine.job_list(JobListParams(kinds=(KIND,), limit=1000))
            return [dt.datetime.fromisoformat(j.metadata["slot"]) for j in jobs]

        def wait_for_slots(count: int) -> None:
            # Progress, not a pace: a loaded machine only makes this take longer.
            deadline = time.monotonic() + 120
            while len(slots()) < count:
                assert time.monotonic() < deadline, f"only {len(slots())} slots inserted"
                time.sleep(0.2)

        threads = [
            threading.Thread(target=loop, args=(m, s))
            for m, s in zip(maintainers, stops, strict=True)
        ]
        for t in threads:
            t.start()
        wait_for_slots(4)
        # Hand over: whichever leads now stops and resigns; the other takes over.
        leader = tx_engine.leader_get()
        first = clients.index(leader) if leader in clients else 0
        stops[first].set()
        maintainers[first].wake.set()
        threads[first].join(10)
        before = len(slots())
        wait_for_slots(before + 4)
        stops[1 - first].set()
        maintainers[1 - first].wake.set()
        threads[1 - first].join(10)

        counted = collections.Counter(slots())
        assert all(n == 1 for n in counted.values()), counted
        ordered = sorted(counted)
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ordered)]
        shown = " ".join(s.strftime("%S") for s in ordered)
        # Every insert is a whole slot of the schedule, each once. A round that ran
        # late may skip slots (catch_up="once" inserts only the latest missed one),
        # so the gaps are whole seconds, never less than one.
        assert all(g >= 1.0 and g == int(g) for g in gaps), shown
        assert len(ordered) >= before + 4, shown
    finally:
        unregister_periodic("leader-tick")
