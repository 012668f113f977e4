"""The admin as an operator uses it, in a real browser, on the suite's engine."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from django_hopper import api, append, consume, queues
from django_hopper.engine import get_engine
from django_hopper.models import Job, JobHistory
from tests.browser.conftest import login, shot
from tests.engine_conformance.support import store_raw
from tests.test_admin import completed_job, discarded_job
from tests.test_admin_controls import two_step_workflow
from tests.testapp import jobs as testjobs
from tests.testapp.resumable_jobs import rs_pages

pytestmark = pytest.mark.browser


def accept_dialogs(page: Any) -> None:
    page.on("dialog", lambda dialog: dialog.accept())


def test_overview__shows_the_queues_and_refreshes_itself(page: Any, superuser: Any) -> None:
    engine = get_engine()
    engine.queue_ensure(["default", "emails"])
    testjobs.add.enqueue(1, 2)
    completed_job(engine)
    discarded_job(engine)
    queues.set_queue_limits("emails", global_limit=2)
    login(page, "boss")
    page.goto("/admin/django_hopper/")
    page.click("a.hopper-overview-link")
    row = page.locator('tr[data-queue="default"]')
    assert row.locator("td").nth(2).inner_text() == "1"
    assert page.locator('tr[data-queue="emails"]').inner_text().count("2 running") == 1
    assert page.locator("svg.hopper-chart rect.bad").count() >= 1
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    shot(page, "overview")
    testjobs.add.enqueue(3, 4)  # the live refresh shows it without a reload
    page.wait_for_function(
        "document.querySelector('tr[data-queue=\"default\"] td:nth-child(3)').innerText === '2'",
        timeout=45_000,  # a refresh comes every 5 s; a loaded machine is slow to render it
    )
    page.uncheck("#hopper-live")
    assert page.evaluate("localStorage.getItem('hopper-overview-live')") == "off"
    page.click('tr[data-queue="default"] td:nth-child(3) a')
    assert "queue=default" in page.url and "state=available" in page.url


def test_job_list__filters_and_fits_the_window(page: Any, superuser: Any) -> None:
    get_engine().queue_ensure(["default", "emails"])
    testjobs.add.enqueue_many([((i, i), {}) for i in range(5)])
    testjobs.send_email.enqueue("x@example.com")
    login(page, "boss")
    page.goto("/admin/django_hopper/job/")
    assert page.locator("#result_list tbody tr").count() == 6
    page.click("#changelist-filter >> text=emails")
    page.wait_for_url(re.compile(r"queue=emails"))
    assert page.locator("#result_list tbody tr").count() == 1
    page.goto("/admin/django_hopper/job/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    results = page.locator("div.results")
    assert results.evaluate("e => e.scrollWidth <= e.clientWidth")  # the table fits, no scrollbar
    id_text = page.locator(".field-job_id a span").first
    box = id_text.bounding_box()
    assert box is not None and box["height"] < 40  # an ID on one line
    shot(page, "jobs")


def test_run_list__shows_a_run_that_does_not_decode_in_red_and_fits_the_window(
    page: Any, superuser: Any
) -> None:
    walking = rs_pages.start(40, instance="supplier-17")
    rs_pages.start(40, instance="supplier-18")
    garbled = rs_pages.start(40, instance="supplier-19")
    store_raw(
        walking.id,
        "progress",
        '{"step": "pass", "cursor": {"cursor": {"page": 12, "after": "sku-88120"},'
        ' "counters": {"rows": 1200}, "passes": 12}, "at": "2026-12-01T10:00:00+00:00"}',
    )
    store_raw(garbled.id, "progress", '"halfway"')
    now = get_engine().now()
    Job.objects.filter(id=walking.id).update(
        admission_misses=1, lease_began_at=now, lease_expires_at=now + dt.timedelta(minutes=5)
    )
    login(page, "boss")
    page.goto("/admin/django_hopper/resumablerun/")
    assert page.locator("#result_list tbody tr").count() == 3
    error = page.locator(".hopper-decode-error")
    assert error.count() == 1 and "progress" in error.inner_text()
    assert error.evaluate("e => getComputedStyle(e).color") != page.locator(
        ".field-state"
    ).first.evaluate("e => getComputedStyle(e).color")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    results = page.locator("div.results")
    assert results.evaluate("e => e.scrollWidth <= e.clientWidth")  # every column shows
    shot(page, "runs")


def test_job_page__cancel_then_retry_with_the_buttons(page: Any, superuser: Any) -> None:
    job_id = testjobs.add.enqueue(1, 2).id
    accept_dialogs(page)
    login(page, "boss")
    page.goto(f"/admin/django_hopper/job/{job_id}/find/")
    page.click("button[value=cancel]")
    page.wait_for_url(re.compile(r"/jobhistory/"))
    assert "Cancel 1 job: 1 canceled." in page.locator("ul.messagelist").inner_text()
    assert JobHistory.objects.get(id=job_id).state == "canceled"
    assert page.locator("button[value=cancel]").count() == 0
    page.click("button[value=retry]")
    page.wait_for_url(re.compile(r"/django_hopper/job/"))
    assert Job.objects.get(id=job_id).state == "available"


def test_job_page__shows_the_timeline_and_wraps_a_long_error(page: Any, superuser: Any) -> None:
    job_id = discarded_job(get_engine())
    login(page, "boss")
    page.goto(f"/admin/django_hopper/job/{job_id}/find/")
    assert "attempt 1 started" in page.locator("table.hopper-timeline").inner_text()
    pre = page.locator("pre.hopper-pre").first
    assert pre.evaluate("e => getComputedStyle(e).whiteSpace") == "pre-wrap"
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    shot(page, "job")


def test_bulk_cancel__all_matching_the_filter(page: Any, superuser: Any) -> None:
    testjobs.add.enqueue_many([((i, i), {}) for i in range(120)])
    keep = testjobs.send_email.enqueue("x@example.com").id
    login(page, "boss")
    page.goto(f"/admin/django_hopper/job/?kind={testjobs.add.kind}")
    page.check("#action-toggle")
    page.click("div.actions .question a")  # "Select all 120 live jobs"
    page.select_option("select[name=action]", "cancel_jobs")
    page.click("button[name=index]")
    assert "Cancel 120 jobs: 120 canceled." in page.locator("ul.messagelist").inner_text()
    assert list(Job.objects.values_list("id", flat=True)) == [keep]


def test_queues__pause_resume_and_the_limits_form_shows_every_error(
    page: Any, superuser: Any
) -> None:
    get_engine().queue_ensure(["default"])
    login(page, "boss")
    page.goto("/admin/django_hopper/queue/")
    page.check("input[name=_selected_action][value=default]")
    page.select_option("select[name=action]", "pause_queues")
    page.click("button[name=index]")
    assert "Pause 1 queue: 1 paused." in page.locator("ul.messagelist").inner_text()
    assert queues.list_queues()[0].paused_at is not None
    page.check("input[name=_selected_action][value=default]")
    page.select_option("select[name=action]", "resume_queues")
    page.click("button[name=index]")
    assert queues.list_queues()[0].paused_at is None
    page.click("td.field-limits_link a")
    page.fill("#id_global_limit", "-1")
    page.fill("#id_burst", "5")
    page.click("input[name=_save]")
    errors = page.locator(".form-row.errors")
    assert errors.count() == 2
    assert "needs a rate" in page.locator(".field-burst").inner_text()
    # The form is laid out by the admin's forms.css (where Django puts label and
    # field differs between Django versions, so the stylesheet itself is asserted).
    assert page.locator('link[href$="admin/css/forms.css"]').count() == 1
    shot(page, "limits")


def test_workflow_page__draws_the_graph_and_cancels_the_rest(page: Any, superuser: Any) -> None:
    handle = two_step_workflow()
    accept_dialogs(page)
    login(page, "boss")
    page.goto(f"/admin/django_hopper/batch/{handle.id}/change/")
    assert page.locator("svg.hopper-dag rect").count() == 2
    shot(page, "workflow")
    page.click("button[value=cancel_rest]")
    assert "Cancel the rest of 2 jobs: 2 canceled." in page.locator("ul.messagelist").inner_text()
    assert {api.get_job(j.id).state for j in handle.jobs} == {"canceled"}
    assert "2 canceled" in page.locator(".field-progress").inner_text()


def test_view_only_user__sees_the_pages_and_is_refused_every_action(page: Any, viewer: Any) -> None:
    get_engine().queue_ensure(["default"])
    job_id = testjobs.add.enqueue(1, 2).id
    login(page, "viewer")
    page.goto(f"/admin/django_hopper/job/{job_id}/find/")
    assert page.locator("button[value=cancel]").count() == 0
    page.goto("/admin/django_hopper/job/")
    assert page.locator("select[name=action]").count() == 0
    page.goto("/admin/django_hopper/queue/")
    assert page.locator("td.field-limits_link").count() == 0
    response = page.goto("/admin/django_hopper/queue/default/limits/")
    assert response is not None and response.status == 403
    page.goto("/admin/django_hopper/queue/overview/")
    assert page.locator('tr[data-queue="default"]').count() == 1
    assert Job.objects.get(id=job_id).state == "available"


def test_stream_consumers__lag_then_pause_and_resume(page: Any, superuser: Any) -> None:
    consume("orders-projection", "orders.#", testjobs.on_message, start="earliest", save=True)
    for i in range(3):
        append("orders.created", {"id": i})
    login(page, "boss")
    page.goto("/admin/django_hopper/streamconsumer/")
    assert page.locator("td.field-lag").inner_text() == "3"
    page.check("input[name=_selected_action][value=orders-projection]")
    page.select_option("select[name=action]", "pause_consumers")
    page.click("button[name=index]")
    assert "Pause 1 consumer: 1 paused." in page.locator("ul.messagelist").inner_text()
    assert "paused" in page.locator("td.field-state").inner_text()
    page.check("input[name=_selected_action][value=orders-projection]")
    page.select_option("select[name=action]", "resume_consumers")
    page.click("button[name=index]")
    assert page.locator("td.field-state").inner_text() == "delivering"
