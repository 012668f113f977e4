"""The admin: pages render for live and finished jobs, actions go through the api."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client as HttpClient
from django.urls import reverse

from django_hopper import api
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalizeParams,
    LeaderParams,
)
from django_hopper.models import Job, JobHistory
from django_hopper.types import AttemptError, QueueRow
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db


def discarded_job(engine: BaseEngine) -> uuid.UUID:
    """Run a job once and record it discarded with an error, a trace, output-less."""
    job_id = testjobs.fail.using(max_attempts=1).enqueue("kaput").id
    client = engine.client_register(ClientRegisterParams(hostname="h", ttl=dt.timedelta(minutes=1)))
    [row] = engine.job_claim(JobClaimParams(queue="default", client_id=client, limit=1)).jobs
    engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[
                JobFinalize(
                    id=row.id,
                    attempted_by=client,
                    fence=row.fence,
                    state="discarded",
                    error=AttemptError(
                        at=None,
                        attempt=row.attempt,
                        error="RuntimeError: kaput",
                        trace='Traceback: File "jobs.py", line 1 <in fail>',
                    ),
                    log="working on it\n",
                )
            ]
        )
    )
    return job_id


def completed_job(engine: BaseEngine) -> uuid.UUID:
    job_id = testjobs.add.enqueue(2, 3).id
    client = engine.client_register(ClientRegisterParams(hostname="h", ttl=dt.timedelta(minutes=1)))
    [row] = engine.job_claim(JobClaimParams(queue="default", client_id=client, limit=1)).jobs
    engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[
                JobFinalize(
                    id=row.id,
                    attempted_by=client,
                    fence=row.fence,
                    state="completed",
                    output={"sum": 5},
                )
            ]
        )
    )
    return job_id


def act(client: HttpClient, model: str, action: str, ids: Sequence[uuid.UUID | str]) -> list[str]:
    """Post an admin action on the changelist (ids: primary keys); return the messages shown."""
    url = reverse(f"admin:django_hopper_{model}_changelist")
    response = client.post(
        url, {"action": action, "_selected_action": [str(i) for i in ids]}, follow=True
    )
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_changelist__lists_live_jobs_newest_first(admin_client: HttpClient) -> None:
    older = testjobs.add.enqueue(1, 2)
    newer = testjobs.send_email.enqueue("x@example.com")
    response = admin_client.get(reverse("admin:django_hopper_job_changelist"))
    assert response.status_code == 200
    body = response.content.decode()
    assert body.index(str(newer.id)) < body.index(str(older.id))
    assert "0/3" in body  # attempt/max_attempts of send_email
    assert testjobs.send_email.kind in body


def test_changelist__filters_by_state_queue_and_kind(admin_client: HttpClient) -> None:
    a = testjobs.add.enqueue(1, 2)
    b = testjobs.send_email.enqueue("x@example.com")
    url = reverse("admin:django_hopper_job_changelist")
    body = admin_client.get(url, {"queue": "emails"}).content.decode()
    assert str(b.id) in body and str(a.id) not in body
    body = admin_client.get(url, {"kind": testjobs.add.kind}).content.decode()
    assert str(a.id) in body and str(b.id) not in body
    body = admin_client.get(url, {"state": "available"}).content.decode()
    assert str(a.id) in body and str(b.id) in body


def test_changelist__search_finds_a_job_by_exact_id_or_by_kind(admin_client: HttpClient) -> None:
    a = testjobs.add.enqueue(1, 2)
    b = testjobs.add.enqueue(3, 4)
    c = testjobs.send_email.enqueue("x@example.com")
    url = reverse("admin:django_hopper_job_changelist")
    body = admin_client.get(url, {"q": str(b.id)}).content.decode()
    assert str(b.id) in body and str(a.id) not in body
    body = admin_client.get(url, {"q": "send_em"}).content.decode()
    assert str(c.id) in body and str(a.id) not in body


def test_detail__live_job_shows_args_metadata_and_is_read_only(admin_client: HttpClient) -> None:
    handle = testjobs.add.using(metadata={"tenant": "acme"}, tags=["t1"]).enqueue(40, b=2)
    url = reverse("admin:django_hopper_job_change", args=[handle.id])
    response = admin_client.get(url)
    assert response.status_code == 200
    body = response.content.decode()
    assert "acme" in body and "&quot;kwargs&quot;" in body and "40" in body
    assert 'name="_save"' not in body  # a view, not a form
    assert admin_client.post(url, {"queue": "other"}).status_code == 403
    assert api.get_job(handle.id).queue == "default"


def test_detail__history_job_shows_errors_trace_logs(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    job_id = discarded_job(engine)
    response = admin_client.get(reverse("admin:django_hopper_jobhistory_change", args=[job_id]))
    assert response.status_code == 200
    body = response.content.decode()
    assert "RuntimeError: kaput" in body
    assert "&lt;in fail&gt;" in body  # the trace, escaped
    assert "working on it" in body  # the attempt log, from hopper_job_log


def test_detail__completed_job_shows_its_output(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    job_id = completed_job(engine)
    body = admin_client.get(
        reverse("admin:django_hopper_jobhistory_change", args=[job_id])
    ).content.decode()
    assert "&quot;sum&quot;: 5" in body


def test_history_changelist__lists_finished_jobs(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    job_id = discarded_job(engine)
    response = admin_client.get(reverse("admin:django_hopper_jobhistory_changelist"))
    assert response.status_code == 200
    assert str(job_id) in response.content.decode()


def test_action__retry_moves_a_discarded_job_back_to_live(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    job_id = discarded_job(engine)
    msgs = act(admin_client, "jobhistory", "retry_jobs", [job_id])
    assert msgs == ["Retry 1 job: 1 retried."]
    assert Job.objects.get(id=job_id).state == "available"
    assert not JobHistory.objects.filter(id=job_id).exists()


def test_action__cancel_moves_waiting_jobs_to_history(admin_client: HttpClient) -> None:
    ids = [testjobs.add.enqueue(i, i).id for i in range(2)]
    act(admin_client, "job", "cancel_jobs", ids)
    assert set(JobHistory.objects.values_list("state", flat=True)) == {"canceled"}
    assert not Job.objects.exists()


def test_action__delete_reports_a_running_job_and_deletes_the_rest(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    running = testjobs.add.enqueue(1, 1).id
    client = engine.client_register(ClientRegisterParams(hostname="h", ttl=dt.timedelta(minutes=1)))
    engine.job_claim(JobClaimParams(queue="default", client_id=client, limit=1))
    waiting = testjobs.add.enqueue(2, 2).id
    msgs = act(admin_client, "job", "delete_jobs", [running, waiting])
    [msg] = msgs  # one summary: the deleted and the refused
    assert "Delete 2 jobs: 1 deleted, 1 refused (running: cancel it first)" in msg
    assert str(running) in msg
    assert list(Job.objects.values_list("id", flat=True)) == [running]


def test_action__retry_reports_a_unique_conflict(admin_client: HttpClient) -> None:
    first = testjobs.add.using(unique_key="u").enqueue(1, 2).id
    api.cancel_job(first)
    testjobs.add.using(unique_key="u").enqueue(1, 2)
    msgs = act(admin_client, "jobhistory", "retry_jobs", [first])
    assert msgs == [
        f"Retry 1 job: 1 refused (a live job holds its unique key). "
        f"Refused: job {first}: a live job holds its unique key."
    ]
    assert JobHistory.objects.get(id=first).state == "canceled"


def test_admin__has_no_add_or_orm_delete(admin_client: HttpClient) -> None:
    assert admin_client.get(reverse("admin:django_hopper_job_add")).status_code == 403
    job_id = testjobs.add.enqueue(1, 2).id
    response = admin_client.get(reverse("admin:django_hopper_job_delete", args=[job_id]))
    assert response.status_code == 403
    changelist = admin_client.get(reverse("admin:django_hopper_job_changelist")).content.decode()
    assert "delete_selected" not in changelist


def test_actions__need_change_permission(db: None, django_user_model: Any) -> None:
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    http = HttpClient()
    http.force_login(user)
    job_id = testjobs.add.enqueue(1, 2).id
    body = http.get(reverse("admin:django_hopper_job_changelist")).content.decode()
    assert str(job_id) in body
    assert "cancel_jobs" not in body
    act(http, "job", "cancel_jobs", [job_id])
    assert Job.objects.filter(id=job_id).exists()


@pytest.mark.parametrize("model", ["queue", "client", "leader"])
def test_changelist__renders_for_queues_clients_and_leader(
    admin_client: HttpClient, engine: BaseEngine, model: str
) -> None:
    engine.queue_ensure(["default", "emails"])
    client = engine.client_register(ClientRegisterParams(hostname="web-1", ttl=dt.timedelta(1)))
    engine.leader_attempt(LeaderParams(client_id=client, ttl=dt.timedelta(minutes=1)))
    response = admin_client.get(reverse(f"admin:django_hopper_{model}_changelist"))
    assert response.status_code == 200
    body = response.content.decode()
    expected = {"queue": "emails", "client": "web-1", "leader": str(client)}[model]
    assert expected in body


def test_queue_changelist__shows_pause_state(admin_client: HttpClient, engine: BaseEngine) -> None:
    engine.queue_ensure(["default"])
    rows: list[QueueRow] = engine.queue_list()
    assert [r.name for r in rows] == ["default"]
    body = admin_client.get(reverse("admin:django_hopper_queue_changelist")).content.decode()
    assert "icon-no" in body  # not paused
