"""System checks of the HOPPER setting: every bad value fails ``manage.py check`` with a hint."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

BASE: dict[str, Any] = {"QUEUES": {"default": 10}}


def hopper_messages(**hopper: Any) -> dict[str, Any]:
    """Run the hopper checks under ``HOPPER = BASE | hopper``; return the messages by ID."""
    with override_settings(HOPPER={**BASE, **hopper}):
        messages = run_checks(tags=["hopper"])
    return {m.id: m for m in messages}


def test_the_test_settings_pass_every_check() -> None:
    assert [m for m in hopper_messages() if m.startswith("hopper.E")] == []


@pytest.mark.parametrize(
    ("key", "value", "check_id"),
    [
        ("RESCUE_STUCK_AFTER", -1, "hopper.E009"),
        ("RESCUE_STUCK_AFTER", "1h", "hopper.E009"),
        ("JOB_TIMEOUT", -5, "hopper.E009"),
        ("COMPLETER_FLUSH_INTERVAL", -0.1, "hopper.E009"),
        ("STREAM_RETENTION", None, "hopper.E009"),
        ("BACKOFF_BASE", -1, "hopper.E009"),
        ("BACKOFF_EXPONENT", "4", "hopper.E009"),
        ("KEEP_LOGS", -1, "hopper.E010"),
        ("KEEP_LOGS", 2.5, "hopper.E010"),
        ("COMPLETER_BATCH_SIZE", 0, "hopper.E010"),
        ("STREAM_PUMP_LIMIT", 0, "hopper.E010"),
        ("DEFAULT_MAX_ATTEMPTS", 0, "hopper.E010"),
        ("COMPLETED_RETENTION", 0, "hopper.E008"),
        ("FAILED_RETENTION", -1, "hopper.E008"),
        ("BACKOFF_MAX", 0, "hopper.E008"),
        ("CLIENT_TTL", 0, "hopper.E008"),
        ("BACKOFF_JITTER", 1.5, "hopper.E011"),
        ("BACKOFF_JITTER", -0.1, "hopper.E011"),
        ("ARCHIVE_COMPLETED", "yes", "hopper.E013"),
        ("PREPARED_STATEMENTS", 1, "hopper.E013"),
        ("IMPORTS", "app.jobs", "hopper.E014"),
        ("ADMISSION_MISS_MAX", 0, "hopper.E010"),
        ("ADMISSION_MISS_MAX", 2.5, "hopper.E010"),
        ("PASS_LEASE_MARGIN", 1, "hopper.E130"),
        ("PASS_LEASE_MARGIN", -0.1, "hopper.E130"),
        ("PASS_LEASE_MARGIN", "0.25", "hopper.E130"),
        ("CLAIM_AHEAD", -1, "hopper.E018"),
        ("CLAIM_AHEAD", 2.5, "hopper.E018"),
        ("CLAIM_AHEAD", True, "hopper.E018"),
        ("CLAIM_AHEAD", "10", "hopper.E018"),
    ],
)
def test_a_bad_value_is_an_error_with_a_hint(key: str, value: Any, check_id: str) -> None:
    messages = hopper_messages(**{key: value})
    assert check_id in messages, messages
    assert key in messages[check_id].msg
    assert messages[check_id].hint


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("RESCUE_STUCK_AFTER", 0),
        ("JOB_TIMEOUT", 0),
        ("KEEP_LOGS", 0),
        ("COMPLETER_FLUSH_INTERVAL", 0),
        ("STREAM_RETENTION", 0),
        ("BACKOFF_JITTER", 0),
        ("BACKOFF_JITTER", 1),
        ("PASS_LEASE_MARGIN", 0),
        ("CLAIM_AHEAD", 0),
        ("CLAIM_AHEAD", None),
        ("CLAIM_AHEAD", 20),
    ],
)
def test_a_zero_that_has_a_meaning_is_accepted(key: str, value: Any) -> None:
    assert [m for m in hopper_messages(**{key: value}) if m.startswith("hopper.E")] == []


@pytest.mark.parametrize("heartbeat", [30.0, 45.0])
def test_a_heartbeat_interval_not_shorter_than_the_client_ttl_is_an_error(
    heartbeat: float,
) -> None:
    messages = hopper_messages(CLIENT_TTL=30.0, HEARTBEAT_INTERVAL=heartbeat)
    assert "hopper.E012" in messages
    assert "fenced" in messages["hopper.E012"].hint


def test_a_heartbeat_interval_shorter_than_the_client_ttl_passes() -> None:
    assert "hopper.E012" not in hopper_messages(CLIENT_TTL=30.0, HEARTBEAT_INTERVAL=29.0)


def test_a_stuck_rescue_before_the_job_timeout_is_a_warning() -> None:
    messages = hopper_messages(RESCUE_STUCK_AFTER=60, JOB_TIMEOUT=120)
    assert "hopper.W002" in messages and messages["hopper.W002"].hint
    assert "hopper.W002" not in hopper_messages(RESCUE_STUCK_AFTER=600, JOB_TIMEOUT=120)
    assert "hopper.W002" not in hopper_messages(RESCUE_STUCK_AFTER=0, JOB_TIMEOUT=120)


def test_unknown_keys_queues_and_database_are_still_checked() -> None:
    assert "hopper.E002" in hopper_messages(NOT_A_KEY=1)
    assert "hopper.E005" in hopper_messages(QUEUES={})
    assert "hopper.E007" in hopper_messages(QUEUES={"default": 0})
    assert "hopper.E003" in hopper_messages(DATABASE="nope")
