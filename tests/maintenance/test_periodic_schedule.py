"""Schedules, slots, the catch-up policy and declarations (no database)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from django_hopper import periodic
from django_hopper.periodic import (
    InvalidPeriodic,
    PeriodicDefinition,
    Schedule,
    define_periodic,
    digest,
    due_slot,
)

UTC = dt.UTC
SECOND = dt.timedelta(seconds=1)


def at(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def test_cron_slots_follow_the_time_zone() -> None:
    schedule = Schedule.parse("0 9 * * *", None, "Europe/Paris")
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    assert schedule.latest_at_or_before(at(2024, 1, 15, 12)) == at(2024, 1, 15, 8)
    assert schedule.latest_at_or_before(at(2024, 7, 15, 12)) == at(2024, 7, 15, 7)
    assert schedule.next_after(at(2024, 7, 15, 12)) == at(2024, 7, 16, 7)


def test_a_slot_time_is_its_own_latest_slot() -> None:
    schedule = Schedule.parse("*/5 * * * *", None, "UTC")
    assert schedule.latest_at_or_before(at(2024, 1, 1, 12, 5)) == at(2024, 1, 1, 12, 5)
    assert schedule.latest_at_or_before(at(2024, 1, 1, 12, 9, 59)) == at(2024, 1, 1, 12, 5)
    assert schedule.next_after(at(2024, 1, 1, 12, 5)) == at(2024, 1, 1, 12, 10)


def test_interval_slots_are_aligned_to_the_epoch() -> None:
    schedule = Schedule.parse(None, dt.timedelta(minutes=15), None)
    assert schedule.latest_at_or_before(at(2024, 1, 1, 12, 20, 5)) == at(2024, 1, 1, 12, 15)
    assert schedule.next_after(at(2024, 1, 1, 12, 15)) == at(2024, 1, 1, 12, 30)


def test_an_on_time_slot_is_due_once() -> None:
    schedule = Schedule.parse(None, SECOND * 10, None)
    now = at(2024, 1, 1, 12, 0, 3)
    assert due_slot(schedule, last_slot=None, now=now) == at(2024, 1, 1, 12)
    assert due_slot(schedule, last_slot=at(2024, 1, 1, 12), now=now) is None


@pytest.mark.parametrize(("catch_up", "expected"), [("once", True), ("skip", False)])
def test_after_an_outage_catch_up_once_inserts_the_latest_missed_slot(
    catch_up: str, expected: bool
) -> None:
    schedule = Schedule.parse("0 * * * *", None, "UTC")
    now = at(2024, 1, 1, 15, 30)  # slots of 11:00 .. 15:00 were missed
    slot = due_slot(schedule, last_slot=at(2024, 1, 1, 10), now=now, catch_up=catch_up)
    assert slot == (at(2024, 1, 1, 15) if expected else None)
    # Skipped: the next slot is on time and due.
    assert due_slot(
        schedule, last_slot=at(2024, 1, 1, 10), now=at(2024, 1, 1, 16, 0, 5), catch_up=catch_up
    ) == at(2024, 1, 1, 16)


def test_a_new_periodic_job_does_not_catch_up() -> None:
    schedule = Schedule.parse("0 3 * * *", None, "UTC")
    assert due_slot(schedule, last_slot=None, now=at(2024, 1, 1, 12)) is None


@pytest.mark.parametrize(
    "spec", ["*/5 * * *", "61 * * * *", "* * 31 2 *", "every minute", "", "* * * * * * *"]
)
def test_a_bad_cron_spec_is_a_clear_error_at_declaration(spec: str) -> None:
    with pytest.raises(InvalidPeriodic, match="bad cron spec") as info:
        define_periodic("tests.job", cron=spec)
    assert info.value.field == "cron"


def test_an_unknown_time_zone_and_a_bad_interval_are_refused() -> None:
    with pytest.raises(InvalidPeriodic, match="unknown time zone"):
        define_periodic("tests.job", cron="* * * * *", tz="Mars/Olympus")
    with pytest.raises(InvalidPeriodic, match="every"):
        define_periodic("tests.job", every=dt.timedelta(0))
    with pytest.raises(InvalidPeriodic, match="exactly one"):
        define_periodic("tests.job", cron="* * * * *", every=5)
    with pytest.raises(InvalidPeriodic, match="catch_up"):
        define_periodic("tests.job", every=5, catch_up="twice")  # type: ignore[arg-type]


def test_the_decorator_returns_the_job_and_registers_it() -> None:
    def tick() -> None: ...

    try:
        assert periodic.periodic(every=30, name="tests.tick")(tick) is tick
        assert [d.name for d in periodic.definitions()] == ["tests.tick"]
        with pytest.raises(InvalidPeriodic, match="declared twice"):
            periodic.register_periodic(tick, every=60, name="tests.tick")
    finally:
        periodic.unregister_periodic("tests.tick")


def test_the_digest_is_stable_and_changes_with_the_definition() -> None:
    a = define_periodic("tests.job", cron="*/5 * * * *", tz="Europe/Paris").to_json()
    b = define_periodic("tests.job", cron="*/5  *  * * *", tz="Europe/Paris").to_json()
    c = define_periodic("tests.job", cron="*/10 * * * *", tz="Europe/Paris").to_json()
    assert digest(a) == digest(b) != digest(c)
    assert len(digest(a)) == 64


def test_a_definition_round_trips_through_its_registration_json() -> None:
    d = define_periodic(
        "tests.job", every=dt.timedelta(seconds=90), args=[1], kwargs={"x": 2}, queue="q",
        priority=5, tags=["a"], ttl=dt.timedelta(minutes=5), catch_up="skip",
    )  # fmt: skip
    again = PeriodicDefinition.from_json(d.to_json())
    assert again.to_json() == d.to_json()
    params = periodic.job_params(d.to_json(), d.name, at(2024, 1, 1))
    assert params.kind == "tests.job"
    assert params.queue == "q" and params.priority == 5 and params.tags == ("a",)
    assert params.args == {"args": [1], "kwargs": {"x": 2}}
    assert params.metadata == {"periodic": "tests.job", "slot": "2024-01-01T00:00:00+00:00"}
    assert params.ttl == dt.timedelta(minutes=5)


def test_the_system_check_reports_a_bad_setting() -> None:
    bad = {"PERIODIC": [{"job": "tests.job", "cron": "*/5 * * *"}]}
    with override_settings(HOPPER=bad):
        errors = periodic.check_periodic()
    assert [e.id for e in errors] == ["hopper.E601"]
    assert "bad cron spec" in errors[0].msg
    good = {"PERIODIC": [{"job": "tests.job", "every": 60, "tz": "Europe/Paris"}]}
    with override_settings(HOPPER=good):
        assert periodic.check_periodic() == []
        assert [d.name for d in periodic.definitions()] == ["tests.job"]
