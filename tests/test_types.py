"""The public vocabulary (``django_hopper.types``) and the name checks built on it.

No database: these are plain values.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import uuid

import pytest

from django_hopper import validation
from django_hopper.engine import topics
from django_hopper.exceptions import InvalidJob
from django_hopper.ids import new_id, new_ids
from django_hopper.types import (
    FINAL_STATES,
    LIVE_STATES,
    WAITING_STATES,
    ControlAction,
    ControlMessage,
    JobState,
)


def test_types__import_without_settings_or_app_registry() -> None:
    code = (
        "import sys\n"
        "import django_hopper.types, django_hopper.engine.base, django_hopper.engine.params\n"
        "import django_hopper.engine.rules\n"
        "from django.apps import apps\n"
        "from django.conf import settings\n"
        "assert not settings.configured, 'settings were configured'\n"
        "assert not apps.ready, 'the app registry was loaded'\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_job_state__partitions_into_live_and_final() -> None:
    assert set(LIVE_STATES) | set(FINAL_STATES) == set(JobState)
    assert not set(LIVE_STATES) & set(FINAL_STATES)
    assert set(WAITING_STATES) == set(LIVE_STATES) - {JobState.RUNNING}
    assert JobState.RUNNING == "running"
    assert JobState.values()[0] == "pending"


@pytest.mark.parametrize(
    "message",
    [
        ControlMessage.cancel(uuid.UUID(int=7)),
        ControlMessage.pause("emails"),
        ControlMessage.resume("emails"),
        ControlMessage.limits("emails", True),
        ControlMessage.limits("emails", False),
        ControlMessage.resigned(42),
    ],
)
def test_control_message__parses_what_it_builds(message: ControlMessage) -> None:
    assert ControlMessage.parse(message.payload()) == message


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "not json",
        "[]",
        '{"queue": "q"}',
        '{"action": "unpause", "queue": "q"}',
        '{"action": "pause"}',
        '{"action": "cancel", "job_id": "not-a-uuid"}',
        '{"action": "resigned", "client_id": "x"}',
    ],
)
def test_control_message__parse_returns_none_for_what_it_cannot_read(payload: str) -> None:
    assert ControlMessage.parse(payload) is None


def test_control_message__payload_keeps_the_wire_format() -> None:
    assert ControlMessage.pause("q").payload() == '{"action": "pause", "queue": "q"}'
    assert ControlAction.CANCEL == "cancel"


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (validation.queue_name, "default\n"),
        (topics.check_topic, "pay.done\n"),
        (topics.check_pattern, "pay.*\n"),
        (topics.check_name, "consumer\n"),
    ],
)
def test_names__with_a_trailing_newline_are_refused(check: object, value: str) -> None:
    with pytest.raises(InvalidJob):
        check(value)  # type: ignore[operator]


def test_new_ids__standard_uuids_version_7_increasing() -> None:
    made = [*new_ids(50), new_id()]
    assert made == sorted(made)
    for value in made:
        assert type(value) is uuid.UUID
        assert value.version == 7
        assert value.is_safe is uuid.SafeUUID.unknown
        assert value == uuid.UUID(str(value))
        assert hash(value) == hash(uuid.UUID(str(value)))
        assert pickle.loads(pickle.dumps(value)) == value
