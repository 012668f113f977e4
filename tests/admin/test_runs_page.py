"""The resumable run pages: a run's walk, its pass lease, a run that does not decode,
a page's cost, and the job actions."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client as HttpClient
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.timezone import localtime

from django_hopper import api, erase_subject
from django_hopper.admin.runs import ResumableRunAdmin
from django_hopper.engine.base import BaseEngine
from django_hopper.models import Job
from tests.engine_conformance.support import store_raw
from tests.testapp import jobs as testjobs
from tests.testapp.resumable_jobs import rs_pages

pytestmark = pytest.mark.django_db

LIVE = "admin:django_hopper_resumablerun_changelist"
FINISHED = "admin:django_hopper_finishedrun_changelist"
COMMITTED = (
    '{"step": "pass", "cursor": {"cursor": {"page": 3}, "counters": {"pages": 3}, "passes": 3},'
    ' "at": "2026-12-01T10:00:00+00:00"}'
)


def page(client: HttpClient, name: str, params: dict[str, str] | None = None) -> tuple[str, int]:
    """Load a list; return its body and how many queries it ran."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(name), params or {})
    assert response.status_code == 200, response.content[:500]
    return response.content.decode(), len(queries.captured_queries)


def test_run_list__shows_each_runs_instance_step_cursor_and_passes(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    walking = rs_pages.start(5, instance="walking")
    fresh = rs_pages.start(5, instance="fresh")
    other = testjobs.add.enqueue(1, 2)  # a job, not a run
    store_raw(walking.id, "progress", COMMITTED)

    body, _ = page(admin_client, LIVE)

    assert str(walking.id) in body and str(fresh.id) in body
    assert str(other.id) not in body
    assert "walking" in body and "fresh" in body
    assert "{&quot;page&quot;: 3}" in body  # the cursor
    assert "3 / 0 of 20" in body  # three passes, no failed one since
    assert reverse("admin:django_hopper_job_change", args=[walking.id]) in body
    assert "does not decode" not in body


def test_run_list__a_run_that_does_not_decode_is_listed_with_its_error(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    good = rs_pages.start(5, instance="good")
    garbled = rs_pages.start(5, instance="garbled")
    foreign = rs_pages.start(5, instance="foreign")
    store_raw(garbled.id, "progress", '"halfway"')
    store_raw(foreign.id, "progress", '{"step": "import", "cursor": {"row": 7}, "at": null}')

    body, _ = page(admin_client, LIVE)

    assert all(str(r.id) in body for r in (good, garbled, foreign))
    assert body.count('class="hopper-decode-error"') == 2
    assert "does not decode: progress: " in body
    assert "not a committed pass of a resumable run" in body


def test_run_list__shows_a_live_runs_pass_lease_and_admission_misses(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    run = rs_pages.start(5, instance="leased")
    began = dt.datetime(2026, 12, 1, 10, 0, 0, tzinfo=dt.UTC)
    expires = began + dt.timedelta(minutes=5)
    Job.objects.filter(id=run.id).update(
        lease_began_at=began, lease_expires_at=expires, admission_misses=2
    )

    body, _ = page(admin_client, LIVE)

    began_text, expires_text = (localtime(t).strftime("%H:%M:%S") for t in (began, expires))
    assert f"began {began_text}<br>expires {expires_text}" in body
    assert '<span class="hopper-run-misses">2 misses</span>' in body


def test_finished_run_list__says_when_a_run_was_erased(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    kept = rs_pages.start(5, instance="kept")
    erased = rs_pages.using(subject="supplier:9").start(5, instance="erased")
    api.cancel_job(kept.id)
    erase_subject("supplier:9")

    body, _ = page(admin_client, FINISHED)

    assert str(kept.id) in body and str(erased.id) in body
    assert '<td class="field-erased_text"><span title="' in body
    assert '<td class="field-erased_text">no</td>' in body
    assert reverse("admin:django_hopper_jobhistory_change", args=[erased.id]) in body


@pytest.mark.parametrize("params", [{}, {"state": "available"}, {"kind": rs_pages.kind}])
def test_run_list__query_count_is_the_same_for_10_and_50_rows_per_page(
    admin_client: HttpClient,
    engine: BaseEngine,
    monkeypatch: pytest.MonkeyPatch,
    params: dict[str, str],
) -> None:
    for i in range(60):
        rs_pages.start(5, instance=f"i{i}")
    monkeypatch.setattr(ResumableRunAdmin, "list_per_page", 10)
    body, small = page(admin_client, LIVE, params)
    assert body.count('name="_selected_action"') == 10
    monkeypatch.setattr(ResumableRunAdmin, "list_per_page", 50)
    body, large = page(admin_client, LIVE, params)
    assert body.count('name="_selected_action"') == 50
    assert small == large


def test_run_list__lists_nothing_when_no_resumable_kind_is_registered(
    admin_client: HttpClient, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = rs_pages.start(5, instance="unseen")
    monkeypatch.setattr("django_hopper.registry.resumable", lambda: ())

    body, _ = page(admin_client, LIVE)

    assert str(run.id) not in body


def test_run_actions__cancel_through_the_bulk_api_and_are_audited(
    admin_client: HttpClient, engine: BaseEngine, admin_user: Any
) -> None:
    runs = [rs_pages.start(5, instance=f"c{i}") for i in range(2)]
    response = admin_client.post(
        reverse(LIVE),
        {"action": "cancel_jobs", "_selected_action": [str(r.id) for r in runs]},
        follow=True,
    )

    assert response.status_code == 200
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["Cancel 2 jobs: 2 canceled."]
    assert {api.get_job(r.id).state for r in runs} == {"canceled"}
    entry = LogEntry.objects.get()
    assert (entry.user_id, entry.object_repr, entry.action_flag) == (
        admin_user.pk,
        "cancel 2 jobs",
        CHANGE,
    )
    assert entry.content_type.model == "resumablerun"


def test_run_actions__a_view_only_user_gets_none(
    admin_client: HttpClient, engine: BaseEngine, django_user_model: Any
) -> None:
    run = rs_pages.start(5, instance="viewed")
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_resumablerun"))
    http = HttpClient()
    http.force_login(viewer)

    body, _ = page(http, LIVE)
    refused = http.post(reverse(LIVE), {"action": "cancel_jobs", "_selected_action": [str(run.id)]})

    assert str(run.id) in body
    assert 'name="action"' not in body
    assert 'name="action"' in page(admin_client, LIVE)[0]
    assert refused.status_code in (200, 302, 403)
    assert api.get_job(run.id).state == "available"
    assert not LogEntry.objects.exists()


def test_run_page__is_its_jobs_page(admin_client: HttpClient, engine: BaseEngine) -> None:
    run = rs_pages.start(5, instance="paged")

    response = admin_client.get(
        reverse("admin:django_hopper_resumablerun_change", args=[run.id]), follow=True
    )

    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == reverse(
        "admin:django_hopper_job_change", args=[run.id]
    )
