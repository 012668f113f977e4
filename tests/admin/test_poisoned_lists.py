"""Operator lists keep working when a stored row does not decode."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client as HttpClient
from django.urls import reverse

from django_hopper import api
from tests.engine_conformance.support import store_raw
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db
SQLITE = connection.vendor == "sqlite"

POISONS = [
    ("progress", '"halfway"', True),
    ("errors", '"boom"', True),
    ("metadata", "[1]", True),
]
if SQLITE:
    POISONS += [
        ("scheduled_at", "not a time", False),
        ("created_at", "", False),
        ("batch_id", "not-a-uuid", False),
        ("attempted_at", "2026-13-45 99:99:99", False),
    ]


@pytest.mark.parametrize(("column", "text", "json"), POISONS, ids=[p[0] for p in POISONS])
@pytest.mark.parametrize("finished", [False, True], ids=["live", "history"])
def test_job_list__a_row_that_does_not_decode_is_listed_with_its_error(
    admin_client: HttpClient, column: str, text: str, json: bool, finished: bool
) -> None:
    before = testjobs.add.enqueue(1, 2).id
    bad = testjobs.add.enqueue(3, 4).id
    after = testjobs.add.enqueue(5, 6).id
    if finished:
        for job_id in (before, bad, after):
            api.cancel_job(job_id)
    store_raw(bad, column, text, json=json)

    listed = api.list_jobs(limit=10)
    model = "jobhistory" if finished else "job"
    page = admin_client.get(reverse(f"admin:django_hopper_{model}_changelist"))

    assert [j.id for j in listed] == [before, bad, after]
    assert listed[1].decode_error and column in listed[1].decode_error
    assert page.status_code == 200
    body = page.content.decode()
    assert all(str(i) in body for i in (before, bad, after))
    assert f"does not decode: {column}: " in body
