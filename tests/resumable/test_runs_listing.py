"""list_runs: the operator's read of resumable runs reports a run it cannot read with
its error, instead of failing the page."""

from __future__ import annotations

import pytest
from django.db import connection

from django_hopper import erase_subject, list_runs
from django_hopper.engine.base import BaseEngine
from tests.engine_conformance.support import store_raw
from tests.testapp import jobs as testjobs
from tests.testapp.resumable_jobs import rs_pages

SQLITE = connection.vendor == "sqlite"
COMMITTED = (
    '{"step": "pass", "cursor": {"cursor": 3, "counters": {"pages": 3}, "passes": 3},'
    ' "at": "2026-12-01T10:00:00+00:00"}'
)


def test_list_runs__reads_each_run_and_names_what_does_not_decode(engine: BaseEngine) -> None:
    walking = rs_pages.start(5, instance="walking")
    fresh = rs_pages.start(5, instance="fresh")
    garbled = rs_pages.start(5, instance="garbled")
    foreign = rs_pages.start(5, instance="foreign")
    erased = rs_pages.using(subject="supplier:9").start(5, instance="erased")
    testjobs.add.enqueue(1, 2)  # not a run
    store_raw(walking.id, "progress", COMMITTED)
    store_raw(garbled.id, "progress", '"halfway"')
    store_raw(foreign.id, "progress", '{"step": "import", "cursor": {"row": 7}, "at": null}')
    store_raw(erased.id, "progress", COMMITTED)
    if SQLITE:
        store_raw(fresh.id, "created_at", "2026-13-45 99:99:99", json=False)
    erase_subject("supplier:9")

    runs = {r.id: r for r in list_runs()}
    only = list_runs(kinds=rs_pages.kind, limit=2)

    assert set(runs) == {walking.id, fresh.id, garbled.id, foreign.id, erased.id}
    assert [r.id for r in only] == [walking.id, fresh.id]
    w = runs[walking.id]
    assert (w.instance, w.cursor, w.counters, w.passes, w.done) == (
        "walking",
        3,
        {"pages": 3},
        3,
        False,
    )
    assert w.decode_error is None
    assert runs[fresh.id].passes == 0 and runs[fresh.id].cursor is None
    if SQLITE:
        assert "created_at: " in (runs[fresh.id].decode_error or "")
    assert "progress: expected a JSON object" in (runs[garbled.id].decode_error or "")
    assert "not a committed pass of a resumable run" in (runs[foreign.id].decode_error or "")
    assert runs[foreign.id].cursor is None
    e = runs[erased.id]
    assert e.erased_at is not None and (e.cursor, e.passes, e.instance) == (None, 0, None)
    assert e.state == "discarded" and e.decode_error is None


@pytest.mark.parametrize("limit", [0])
def test_list_runs__a_zero_limit_reads_nothing(engine: BaseEngine, limit: int) -> None:
    rs_pages.start(5, instance="one")
    assert list_runs(limit=limit) == []
