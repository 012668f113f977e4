"""The overview: per queue depths, pause, limits, the last hour charted; clients and the leader."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test import Client as HttpClient
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_hopper import api, queues
from django_hopper.admin import common
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import ClientRegisterParams, LeaderParams
from tests.test_admin import completed_job, discarded_job
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db

URL = "admin:django_hopper_queue_overview"


def test_overview__shows_each_queue_with_depths_pause_limits_and_links(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    engine.queue_ensure(["default", "emails"])
    testjobs.add.enqueue(1, 2)
    testjobs.send_email.enqueue("x@example.com")
    queues.pause_queue("emails")
    queues.set_queue_limits("default", global_limit=3, rate_per_sec=2)
    body = admin_client.get(reverse(URL)).content.decode()
    assert 'data-queue="default"' in body and 'data-queue="emails"' in body
    assert "<strong>paused</strong>" in body
    assert "3 running, 2/s" in body
    assert "?queue=emails&amp;state=available" in body
    assert 'id="hopper-live"' in body and "django_hopper/admin.js" in body


def test_overview__charts_the_last_hour_and_counts_completed_and_failed(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    completed_job(engine)
    discarded_job(engine)
    body = admin_client.get(reverse(URL), {"partial": "1"}).content.decode()
    assert "<html" not in body  # the live refresh swaps in the body only
    assert "default: 1 completed, 1 failed in the last hour" in body
    assert 'class="ok"' in body and 'class="bad"' in body


def test_overview__lists_live_clients_and_marks_the_leader(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    leader = engine.client_register(ClientRegisterParams(hostname="web-1", ttl=dt.timedelta(1)))
    engine.client_register(ClientRegisterParams(hostname="web-2", ttl=dt.timedelta(1)))
    engine.leader_attempt(LeaderParams(client_id=leader, ttl=dt.timedelta(minutes=1)))
    body = admin_client.get(reverse(URL)).content.decode()
    assert "web-1" in body and "web-2" in body
    assert body.count("<strong>leader</strong>") == 1


def test_overview__query_count_does_not_grow_with_jobs(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    engine.queue_ensure(["default"])

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(reverse(URL)).status_code == 200
        return len(captured.captured_queries)

    testjobs.add.enqueue(1, 2)
    few = queries()
    testjobs.add.enqueue_many([((i, i), {}) for i in range(50)])
    for job in testjobs.add.enqueue_many([((i, i), {}) for i in range(20)]):
        api.cancel_job(job.id)
    assert queries() == few


def test_overview__needs_the_queue_view_permission(db: None, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("nobody", password="pw", is_staff=True)
    http = HttpClient()
    http.force_login(user)
    assert http.get(reverse(URL)).status_code == 403


def test_app_index__links_the_overview(admin_client: HttpClient) -> None:
    body = admin_client.get(reverse("admin:app_list", args=["django_hopper"])).content.decode()
    assert reverse(URL) in body


def test_periodic_registrations__show_the_next_run_of_the_schedule(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    from django.utils.timezone import localtime, now

    from django_hopper.engine.params import PeriodicRegisterParams
    from django_hopper.periodic import define_periodic

    client = engine.client_register(ClientRegisterParams(hostname="web-1", ttl=dt.timedelta(1)))
    often = define_periodic(testjobs.noop, every=3600, name="hourly")
    e: Any = engine
    e.periodic_register(PeriodicRegisterParams(client, [often.registration()]))
    body = admin_client.get(
        reverse("admin:django_hopper_periodicregistration_changelist")
    ).content.decode()
    expected = (now() + dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    assert localtime(expected).strftime("%Y-%m-%d %H:%M:%S") in body


def _capped_page(client: HttpClient, url: str) -> tuple[str, int]:
    """Load a page; on PostgreSQL analyze first, so that the planner has statistics."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE hopper_job")
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return response.content.decode(), len(captured.captured_queries)


def test_overview__a_depth_past_the_limit_is_marked_estimated_at_a_constant_query_count(
    admin_client: HttpClient, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "DEPTH_LIMIT", 3)
    engine.queue_ensure(["default", "emails"])
    testjobs.add.enqueue_many([((i, i), {}) for i in range(5)])
    testjobs.send_email.enqueue("x@example.com")

    body, few = _capped_page(admin_client, reverse(URL))
    # Past the limit: PostgreSQL's estimate, or the floor where there is none.
    shown = "about 5" if connection.vendor == "postgresql" else "3+"
    assert f'state=available">{shown}</a>' in body
    assert 'queue=emails&amp;state=available">1</a>' in body
    assert "exact up to 3" in body

    # More jobs, and a second queue past the limit: the same queries (one EXPLAIN for all).
    testjobs.add.enqueue_many([((i, i), {}) for i in range(40)])
    for _ in range(5):
        testjobs.send_email.enqueue("x@example.com")
    body, more = _capped_page(admin_client, reverse(URL))
    assert more == few
    shown = "about 6" if connection.vendor == "postgresql" else "3+"
    assert f'queue=emails&amp;state=available">{shown}</a>' in body


def test_queues_list__marks_depths_past_the_limit_at_the_same_query_count_per_page_size(
    admin_client: HttpClient, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_hopper.admin.queues import QueueAdmin

    monkeypatch.setattr(common, "DEPTH_LIMIT", 3)
    names = ["default", "emails", "reports"]
    engine.queue_ensure(names)
    for name in names:
        testjobs.add.using(queue=name).enqueue_many([((i, i), {}) for i in range(5)])
    url = reverse("admin:django_hopper_queue_changelist")
    monkeypatch.setattr(QueueAdmin, "list_per_page", 1)
    body, one = _capped_page(admin_client, url)
    assert body.count('<td class="field-available">') == 1
    monkeypatch.setattr(QueueAdmin, "list_per_page", 3)
    body, three = _capped_page(admin_client, url)
    shown = "about 5" if connection.vendor == "postgresql" else "3+"
    assert body.count(f'<td class="field-available">{shown}</td>') == 3
    assert one == three
