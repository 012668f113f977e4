"""The snapshot arithmetic of PostgreSQL stream consumers (pure Python, no database)."""

from __future__ import annotations

from django_hopper.engine.postgres.streams import Snapshot, advance, seek_snapshot


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


def test_advance__a_transaction_finished_past_the_stored_position_is_read() -> None:
    stored = Snapshot.parse("10:13:10,12")  # 12 delivered in part, 10 committed late
    current = Snapshot.parse("13:13:")

    after = advance(stored, current, 10, began_inside=12)  # the rest of 12, then part of 10

    assert visible(after, 12)
    assert not visible(after, 10)
    assert visible(after, 11)


def test_advance__a_transaction_not_reached_stays_unread_after_a_finished_one() -> None:
    stored = Snapshot.parse("5:12:5,8")  # 8 was open at the seek; position inside 12
    current = Snapshot.parse("13:13:")

    after = advance(stored, current, 5, began_inside=12)

    assert [x for x in range(3, 14) if visible(after, x)] == [3, 4, 6, 7, 9, 10, 11, 12]


def test_seek_snapshot__keeps_transactions_in_progress_at_the_seek_unread() -> None:
    current = Snapshot.parse("7:20:7,9,15")

    snap = seek_snapshot(current, 12)

    assert [x for x in range(5, 14) if visible(snap, x)] == [5, 6, 8, 10, 11]
    assert str(seek_snapshot(Snapshot.parse("30:30:"), 12)) == "12:12:"


def test_advance__a_pump_that_stopped_inside_the_transaction_it_began_in_reads_nothing_else() -> (
    None
):
    stored = Snapshot.parse("8:12:8")  # 8 open at a seek to a position inside 12
    current = Snapshot.parse("13:13:")  # 8 has committed since

    assert advance(stored, current, 12, began_inside=12) == stored
