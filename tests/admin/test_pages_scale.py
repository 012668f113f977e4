"""Admin pages cost the same whatever the table's size: bounded counts, cheap filters."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client as HttpClient
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_hopper import api
from django_hopper.admin.jobs import JobAdmin, JobHistoryAdmin
from django_hopper.admin.pagination import EstimatedCountPaginator
from django_hopper.engine.base import BaseEngine
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db


def enqueue(n: int) -> list[str]:
    """Enqueue n jobs of kind add; return their IDs."""
    return [str(h.id) for h in testjobs.add.enqueue_many([((i, i), {}) for i in range(n)])]


def page(client: HttpClient, url: str, params: dict[str, str] | None = None) -> tuple[str, int]:
    """Load a page; return its body and how many queries it ran."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, params or {})
    assert response.status_code == 200, response.content[:500]
    return response.content.decode(), len(queries.captured_queries)


@pytest.mark.parametrize(
    "params", [{}, {"state": "available"}, {"queue": "default"}, {"q": "add"}, {"p": "2"}]
)
def test_job_list__query_count_is_the_same_for_10_and_100_rows_per_page(
    admin_client: HttpClient, monkeypatch: pytest.MonkeyPatch, params: dict[str, str]
) -> None:
    enqueue(210)
    url = reverse("admin:django_hopper_job_changelist")
    monkeypatch.setattr(JobAdmin, "list_per_page", 10)
    body, small = page(admin_client, url, params)
    assert body.count('name="_selected_action"') == 10
    monkeypatch.setattr(JobAdmin, "list_per_page", 100)
    body, large = page(admin_client, url, params)
    assert body.count('name="_selected_action"') == 100
    assert small == large


def test_history_list__query_count_is_the_same_for_10_and_100_rows_per_page(
    admin_client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for job_id in enqueue(110):
        api.cancel_job(job_id)
    url = reverse("admin:django_hopper_jobhistory_changelist")
    monkeypatch.setattr(JobHistoryAdmin, "list_per_page", 10)
    _, small = page(admin_client, url, {"state": "canceled"})
    monkeypatch.setattr(JobHistoryAdmin, "list_per_page", 100)
    _, large = page(admin_client, url, {"state": "canceled"})
    assert small == large


def test_job_list__counts_exactly_below_the_limit(admin_client: HttpClient) -> None:
    enqueue(3)
    body, _ = page(admin_client, reverse("admin:django_hopper_job_changelist"))
    assert "3 live jobs" in body
    assert "count exactly" not in body


def test_job_list__above_the_limit_says_about_or_more_than_and_offers_an_exact_count(
    admin_client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EstimatedCountPaginator, "limit", 5)
    enqueue(12)
    url = reverse("admin:django_hopper_job_changelist")
    body, _ = page(admin_client, url)
    assert "count exactly" in body
    assert ("more than 5 live jobs" in body) or ("about " in body)
    assert "12 live jobs" not in body
    body, _ = page(admin_client, url, {"_count": "exact"})
    assert "12 live jobs" in body
    assert "count exactly" not in body


def test_job_list__never_reads_distinct_values_or_counts_the_whole_table(
    admin_client: HttpClient,
) -> None:
    enqueue(3)
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(reverse("admin:django_hopper_job_changelist"), {"state": "available"})
    sql = " ".join(q["sql"].upper() for q in queries.captured_queries)
    assert "DISTINCT" not in sql
    for q in queries.captured_queries:
        text = q["sql"].upper()
        if "COUNT(" in text:
            assert "LIMIT" in text, text  # a bounded count, never COUNT(*) of the table


def test_state_filter__offers_only_the_states_each_table_can_hold(
    admin_client: HttpClient,
) -> None:
    live, _ = page(admin_client, reverse("admin:django_hopper_job_changelist"))
    done, _ = page(admin_client, reverse("admin:django_hopper_jobhistory_changelist"))
    assert "?state=running" in live and "?state=completed" not in live
    assert "?state=completed" in done and "?state=running" not in done


def test_queue_and_kind_filters__list_known_queues_and_registered_kinds(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    body, _ = page(admin_client, reverse("admin:django_hopper_job_changelist"))
    assert f"?kind={testjobs.send_email.kind}" in body  # registered, though no job exists
    assert "?queue=emails" not in body
    engine.queue_ensure(["emails"])
    body, _ = page(admin_client, reverse("admin:django_hopper_job_changelist"))
    assert "?queue=emails" in body


def test_job_list__a_filter_no_index_serves_is_refused_not_a_server_error(
    admin_client: HttpClient,
) -> None:
    testjobs.add.using(tags=["billing"]).enqueue(1, 2)
    url = reverse("admin:django_hopper_job_changelist")
    response = admin_client.get(url, {"tags__contains": "billing"})
    assert response.status_code in (302, 400)  # the admin's "invalid filter" answer, not a 500


def test_job_list__sorts_only_by_id(admin_client: HttpClient) -> None:
    enqueue(2)
    body, _ = page(admin_client, reverse("admin:django_hopper_job_changelist"))
    assert "sortable column-job_id" in body
    assert "sortable column-queue" not in body and "sortable column-kind" not in body


def test_search__matches_an_unregistered_kind_exactly_and_registered_kinds_by_part(
    admin_client: HttpClient,
) -> None:
    [a] = enqueue(1)
    url = reverse("admin:django_hopper_job_changelist")
    body, _ = page(admin_client, url, {"q": "ADD"})  # part of a registered kind, any case
    assert a in body
    body, _ = page(admin_client, url, {"q": testjobs.add.kind})
    assert a in body
    body, _ = page(admin_client, url, {"q": "nothing.like.this"})
    assert a not in body


def test_times__are_shown_to_the_second(admin_client: HttpClient) -> None:
    [a] = enqueue(1)
    row = api.get_job(a)
    body, _ = page(admin_client, reverse("admin:django_hopper_job_changelist"))
    from django.utils.timezone import localtime

    assert localtime(row.scheduled_at).strftime("%Y-%m-%d %H:%M:%S") in body
