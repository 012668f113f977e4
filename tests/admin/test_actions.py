"""Admin actions: set-based in chunks, one summary message, an audit entry, the limits form."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client as HttpClient
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_hopper import api, queues
from django_hopper.admin import bulk
from django_hopper.engine.base import BaseEngine
from django_hopper.models import Job, JobHistory
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db


def enqueue(n: int, **options: Any) -> list[str]:
    jf = testjobs.add.using(**options) if options else testjobs.add
    return [str(h.id) for h in jf.enqueue_many([((i, i), {}) for i in range(n)])]


def post_action(
    client: HttpClient, model: str, action: str, data: dict[str, Any], query: str = ""
) -> list[str]:
    url = reverse(f"admin:django_hopper_{model}_changelist") + query
    response = client.post(url, {"action": action, **data}, follow=True)
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_bulk_cancel__all_matching_the_filter_runs_a_statement_per_chunk(
    admin_client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "CHUNK", 4)
    monkeypatch.setattr(bulk.apply_in_chunks, "__defaults__", (4,))
    ids = enqueue(10)
    other = testjobs.send_email.enqueue("x@example.com").id
    calls: list[int] = []
    real = api.cancel_jobs

    def counting(job_ids: list[Any]) -> Any:
        calls.append(len(job_ids))
        return real(job_ids)

    monkeypatch.setattr(api, "cancel_jobs", counting)
    msgs = post_action(
        admin_client,
        "job",
        "cancel_jobs",
        {"select_across": "1", "index": "0", "_selected_action": ids[:1]},
        query=f"?kind={testjobs.add.kind}",
    )
    assert calls == [4, 4, 2]  # chunks, not a call per job
    assert msgs == ["Cancel 10 jobs: 10 canceled."]
    assert set(JobHistory.objects.values_list("state", flat=True)) == {"canceled"}
    assert list(Job.objects.values_list("id", flat=True)) == [other]


def test_bulk_cancel__query_count_does_not_grow_with_the_selection(
    admin_client: HttpClient,
) -> None:
    def cancel_all() -> int:
        with CaptureQueriesContext(connection) as queries:
            post_action(
                admin_client,
                "job",
                "cancel_jobs",
                {
                    "select_across": "1",
                    "index": "0",
                    "_selected_action": list(Job.objects.values_list("id", flat=True)[:1]),
                },
            )
        return len(queries.captured_queries)

    enqueue(5)
    few = cancel_all()
    enqueue(200)
    many = cancel_all()
    assert many == few


def test_cancel__of_a_finished_job_is_reported_unchanged_not_as_a_success(
    admin_client: HttpClient,
) -> None:
    [job_id] = enqueue(1)
    api.cancel_job(job_id)
    response = admin_client.post(
        reverse("admin:django_hopper_jobhistory_changelist"),
        {"action": "cancel_jobs", "_selected_action": [job_id]},
        follow=True,
    )
    [message] = list(get_messages(response.wsgi_request))
    assert str(message).startswith("Cancel 1 job: 1 refused (already finished)")
    assert message.level_tag == "error"


def test_bulk_retry__many_refusals_make_one_short_message(admin_client: HttpClient) -> None:
    ids = []
    for i in range(12):
        [job_id] = enqueue(1, unique_key=f"u{i}")
        api.cancel_job(job_id)
        enqueue(1, unique_key=f"u{i}")  # a live job now holds the key
        ids.append(job_id)
    [free] = enqueue(1)
    api.cancel_job(free)
    msgs = post_action(admin_client, "jobhistory", "retry_jobs", {"_selected_action": [*ids, free]})
    [message] = msgs
    assert message.startswith(
        "Retry 13 jobs: 1 retried, 12 refused (a live job holds its unique key)."
    )
    assert len(re.findall(r"job [0-9a-f-]{36}:", message)) == 5  # the first five, not twelve
    assert "(and 7 more)" in message


def test_actions__are_recorded_in_the_admin_log(
    admin_client: HttpClient, engine: BaseEngine, admin_user: Any
) -> None:
    ids = enqueue(3)
    post_action(admin_client, "job", "cancel_jobs", {"_selected_action": ids})
    post_action(admin_client, "jobhistory", "delete_jobs", {"_selected_action": ids[:1]})
    engine.queue_ensure(["default"])
    post_action(admin_client, "queue", "pause_queues", {"_selected_action": ["default"]})
    admin_client.post(
        reverse("admin:django_hopper_queue_limits", args=["default"]), {"global_limit": "3"}
    )
    entries = list(LogEntry.objects.order_by("id"))
    assert [(e.user_id, e.object_repr, e.action_flag) for e in entries] == [
        (admin_user.pk, "cancel 3 jobs", CHANGE),
        (admin_user.pk, "delete 1 job", DELETION),
        (admin_user.pk, "pause 1 queue", CHANGE),
        (admin_user.pk, "set limits of queue default", CHANGE),
    ]
    assert entries[0].change_message == "Cancel 3 jobs: 3 canceled."
    assert entries[1].object_id == ids[0]
    assert entries[2].object_id == "default"
    assert "global_limit 3" in entries[3].change_message


# -- the limits form ---------------------------------------------------------------


def test_limits_form__shows_every_error_at_once_and_changes_nothing(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    queues.set_queue_limits("default", partition_limit=2)
    url = reverse("admin:django_hopper_queue_limits", args=["default"])
    response = admin_client.post(
        url, {"global_limit": "-1", "aging": "-3", "partition_limit": "-2", "burst": "5"}
    )
    assert response.status_code == 200
    body = response.content.decode()
    for field in ("global_limit", "aging", "partition_limit", "burst"):
        assert re.search(rf'errors field-{field}">\s*<ul class="errorlist', body), field
    assert queues.list_queues()[0].limits.partition_limit == 2


def test_limits_form__a_burst_without_a_rate_is_refused(admin_client: HttpClient) -> None:
    queues.set_queue_limits("default")
    url = reverse("admin:django_hopper_queue_limits", args=["default"])
    body = admin_client.post(url, {"burst": "5"}).content.decode()
    assert re.search(r'errors field-burst">\s*<ul class="errorlist', body)
    assert "needs a rate" in body
    with pytest.raises(Exception, match="needs a rate"):
        queues.set_queue_limits("default", burst=5)


def test_limits_form__loads_the_admin_form_styles(admin_client: HttpClient) -> None:
    queues.set_queue_limits("default")
    body = admin_client.get(
        reverse("admin:django_hopper_queue_limits", args=["default"])
    ).content.decode()
    assert "admin/css/forms.css" in body


def test_queue_pages__offer_set_limits_only_to_users_who_may(
    engine: BaseEngine, django_user_model: Any, admin_client: HttpClient
) -> None:
    from django.contrib.auth.models import Permission

    engine.queue_ensure(["default"])
    limits = reverse("admin:django_hopper_queue_limits", args=["default"])
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_queue"))
    http = HttpClient()
    http.force_login(viewer)
    for page in ("changelist", "change"):
        args = [] if page == "changelist" else ["default"]
        url = reverse(f"admin:django_hopper_queue_{page}", args=args)
        assert limits not in http.get(url).content.decode()
        assert limits in admin_client.get(url).content.decode()
