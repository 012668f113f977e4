"""The snapshot arithmetic of PostgreSQL stream consumers (pure Python, no database)."""

from __future__ import annotations

from django_hopper.engine.postgres.streams import Snapshot, advance


def visible(snap: Snapshot, xid: int) -> bool:
    """pg_visible_in_snapshot for a finished transaction."""
    return xid < snap.xmax and xid not in snap.xip


def test_snapshot__round_trips_pg_snapshot_text() -> None:
    assert str(Snapshot.parse("10:20:12,15")) == "10:20:12,15"
    assert str(Snapshot.parse("1:1:")) == "1:1:"


def test_snapshot_without__keeps_the_callers_transaction_unread() -> None:
    snap = Snapshot.parse("10:20:12")

    assert str(snap.without(15)) == "10:20:12,15"
    assert snap.without(None) is snap
    assert snap.without(25) is snap  # not visible anyway


def test_advance__reads_the_delta_below_the_last_xid_and_nothing_else() -> None:
    stored = Snapshot.parse("10:11:10")  # 10 unread; below it read
    current = Snapshot.parse("11:20:11,16")  # 11 and 16 still running

    after = advance(stored, current, 14)  # delivered 10, 12, 13 and part of 14

    assert [x for x in range(8, 22) if visible(after, x)] == [8, 9, 10, 12, 13]
    assert after.xmin == 11  # every xid below it has finished


def test_advance__keeps_the_stored_snapshots_unread_transactions_from_the_last_xid_on() -> None:
    stored = Snapshot.parse("10:30:10,25")
    current = Snapshot.parse("31:40:")

    after = advance(stored, current, 10)

    assert not visible(after, 10)
    assert not visible(after, 25)
    assert visible(after, 20)
