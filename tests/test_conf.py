"""Reading ``HOPPER`` settings: each read sees the setting as it is now.

No database: the settings alone.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from django_hopper.conf import DEFAULTS, hopper_settings


def test_conf__a_read_sees_override_settings_and_what_it_restores() -> None:
    before = hopper_settings.JOB_TIMEOUT
    with override_settings(HOPPER={"JOB_TIMEOUT": 12.5}):
        assert hopper_settings.JOB_TIMEOUT == 12.5
        # A key the override does not set reads its default, not the outer value.
        assert DEFAULTS["DEFAULT_QUEUE"] == hopper_settings.DEFAULT_QUEUE
    assert before == hopper_settings.JOB_TIMEOUT


def test_conf__a_read_sees_an_assignment_to_the_setting_at_once() -> None:
    with override_settings(HOPPER={"ARCHIVE_COMPLETED": True}):
        assert hopper_settings.ARCHIVE_COMPLETED is True
        settings.HOPPER = {"ARCHIVE_COMPLETED": False}
        assert hopper_settings.ARCHIVE_COMPLETED is False
        settings.HOPPER = {**settings.HOPPER, "ARCHIVE_COMPLETED": True}
        assert hopper_settings.ARCHIVE_COMPLETED is True


def test_conf__a_deleted_or_empty_setting_reads_the_defaults() -> None:
    with override_settings(HOPPER={"JOB_TIMEOUT": 3}):
        assert hopper_settings.JOB_TIMEOUT == 3
        del settings.HOPPER
        assert DEFAULTS["JOB_TIMEOUT"] == hopper_settings.JOB_TIMEOUT
        settings.HOPPER = None
        assert DEFAULTS["JOB_TIMEOUT"] == hopper_settings.JOB_TIMEOUT
        settings.HOPPER = {}
        assert hopper_settings.as_dict() == DEFAULTS


def test_conf__every_default_is_readable_and_an_unknown_name_is_refused() -> None:
    with override_settings(HOPPER={}):
        for name, default in DEFAULTS.items():
            assert getattr(hopper_settings, name) == default
    with pytest.raises(AttributeError, match="HOPPER has no setting 'NOT_A_SETTING'"):
        hopper_settings.NOT_A_SETTING  # noqa: B018
