"""manage.py hopper_erase: erases through erase_subject and prints the record, not the subject."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from django_hopper import get_job
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db


def test_hopper_erase__erases_and_prints_the_record_without_the_subject() -> None:
    job_id = testjobs.add.using(subject="user:42").enqueue(1, 2).id
    out = io.StringIO()

    call_command("hopper_erase", "user:42", "--json", stdout=out)

    record = json.loads(out.getvalue())
    assert (record["jobs"], record["running"]) == (1, 0)
    assert "user:42" not in out.getvalue()
    assert get_job(job_id).erased_at is not None and get_job(job_id).args == {}


def test_hopper_erase__refuses_an_empty_subject() -> None:
    with pytest.raises(CommandError, match="subject"):
        call_command("hopper_erase", "")
