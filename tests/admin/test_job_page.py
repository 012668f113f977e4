"""The job page: a URL that follows the job, buttons that act through the api, a timeline."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client as HttpClient
from django.urls import reverse

from django_hopper import api
from django_hopper.models import Job, JobHistory
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db


def test_find__redirects_to_the_job_wherever_it_is_now(admin_client: HttpClient) -> None:
    job_id = testjobs.add.enqueue(1, 2).id
    find = reverse("admin:django_hopper_job_find", args=[job_id])
    live = reverse("admin:django_hopper_job_change", args=[job_id])
    done = reverse("admin:django_hopper_jobhistory_change", args=[job_id])
    assert admin_client.get(find)["Location"] == live
    api.cancel_job(job_id)
    assert admin_client.get(find)["Location"] == done
    # An old link to the live page follows the job to history, and back after a retry.
    assert admin_client.get(live)["Location"] == done
    api.retry_job(job_id)
    assert admin_client.get(done)["Location"] == live
    api.delete_job(job_id)
    assert admin_client.get(find).status_code == 404


def test_job_page__buttons_retry_cancel_and_delete_through_the_api(
    admin_client: HttpClient,
) -> None:
    job_id = testjobs.add.enqueue(1, 2).id
    page = admin_client.get(reverse("admin:django_hopper_job_change", args=[job_id]))
    body = page.content.decode()
    assert 'value="cancel"' in body and "data-confirm" in body
    act = reverse("admin:django_hopper_job_act", args=[job_id])
    response = admin_client.post(act, {"verb": "cancel"}, follow=True)
    assert JobHistory.objects.get(id=job_id).state == "canceled"
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["Cancel 1 job: 1 canceled."]
    body = response.content.decode()
    assert 'value="retry"' in body and 'value="cancel"' not in body  # finished: no cancel
    act = reverse("admin:django_hopper_jobhistory_act", args=[job_id])
    admin_client.post(act, {"verb": "retry"})
    assert Job.objects.get(id=job_id).state == "available"
    response = admin_client.post(
        reverse("admin:django_hopper_job_act", args=[job_id]), {"verb": "delete"}
    )
    assert response["Location"] == reverse("admin:django_hopper_job_changelist")
    assert not Job.objects.filter(id=job_id).exists()


def test_job_page__view_only_users_get_no_buttons_and_cannot_act(
    db: None, django_user_model: Any
) -> None:
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    http = HttpClient()
    http.force_login(user)
    job_id = testjobs.add.enqueue(1, 2).id
    body = http.get(reverse("admin:django_hopper_job_change", args=[job_id])).content.decode()
    assert 'value="cancel"' not in body
    act = reverse("admin:django_hopper_job_act", args=[job_id])
    assert http.post(act, {"verb": "cancel"}).status_code == 403
    assert Job.objects.get(id=job_id).state == "available"


def test_job_page__shows_a_timeline_and_wraps_long_errors(admin_client: HttpClient) -> None:
    from django_hopper.engine import get_engine
    from tests.test_admin import discarded_job

    job_id = discarded_job(get_engine())
    body = admin_client.get(
        reverse("admin:django_hopper_jobhistory_change", args=[job_id])
    ).content.decode()
    assert "hopper-timeline" in body
    assert "enqueued" in body and "attempt 1 started" in body and "discarded" in body
    assert 'class="hopper-pre"' in body
    assert "django_hopper/admin.css" in body


def test_job_page__says_a_job_was_erased_and_shows_none_of_its_data(
    admin_client: HttpClient,
) -> None:
    job_id = testjobs.send_email.using(subject="user:42").enqueue("ada@example.com").id
    live = admin_client.get(reverse("admin:django_hopper_job_change", args=[job_id]))
    assert "user:42" in live.content.decode() and "ada@example.com" in live.content.decode()

    api.erase_subject("user:42")

    page = admin_client.get(reverse("admin:django_hopper_jobhistory_change", args=[job_id]))
    body = page.content.decode()
    assert page.status_code == 200
    assert "erased at " in body and "(erase_subject)" in body
    assert "ada@example.com" not in body and "user:42" not in body


def _job_page(client: HttpClient, job_id: Any) -> str:
    response = client.get(reverse("admin:django_hopper_job_change", args=[job_id]))
    assert response.status_code == 200
    return response.content.decode()


def test_job_page__a_job_held_by_a_job_lease_says_so_and_until_when(
    admin_client: HttpClient,
) -> None:
    import datetime as dt

    from django_hopper.job_leases import claim_job

    job_id = testjobs.add.enqueue(1, 2).id
    claim_job(job_id, lease=120)
    body = _job_page(admin_client, job_id)
    assert "a job lease (claimed by ID" in body
    assert "job lease until" in body and "(in 1" in body  # about 120 s left
    assert "by a job lease" in body  # the timeline's attempt
    assert "Admission misses" in body and "none" in body

    # Past its expiry by database time, the page says the lease expired.
    row = Job.objects.get(id=job_id)
    Job.objects.filter(id=job_id).update(
        lease_expires_at=row.lease_expires_at - dt.timedelta(seconds=600)
    )
    body = _job_page(admin_client, job_id)
    assert "expired at" in body and "s ago): the leader" in body


def test_job_page__shows_a_pass_lease_began_and_its_admission_misses(
    admin_client: HttpClient,
) -> None:
    import datetime as dt

    from django_hopper.engine import get_engine
    from django_hopper.engine.params import (
        ClientRegisterParams,
        JobClaimParams,
        JobPassBeginParams,
        JobPassMissParams,
    )

    engine = get_engine()
    worker = engine.client_register(ClientRegisterParams(hostname="w", ttl=dt.timedelta(1)))
    minute = dt.timedelta(minutes=1)
    job_id = testjobs.add.enqueue(1, 2).id

    def claimed() -> Any:
        (job,) = engine.job_claim(JobClaimParams(queue="default", client_id=worker, limit=1)).jobs
        return job

    job = claimed()
    missed = JobPassMissParams(
        id=job_id, attempted_by=worker, fence=job.fence, max_misses=10, reason="too late"
    )
    engine.job_pass_miss(missed)
    Job.objects.filter(id=job_id).update(
        state="available", scheduled_at=engine.now(), snooze_reason=None
    )
    body = _job_page(admin_client, job_id)
    assert "1 of 10: consecutive claims that did not begin their pass" in body

    job = claimed()
    body = _job_page(admin_client, job_id)
    assert "not begun: claimed" in body
    begin = JobPassBeginParams(
        id=job_id, attempted_by=worker, fence=job.fence, ttl=5 * minute, margin=minute
    )
    assert engine.job_pass_begin(begin) is not None
    body = _job_page(admin_client, job_id)
    assert f'href="/admin/django_hopper/client/{worker}/change/"' in body
    assert "worker&#x27;s pass until" in body
    assert "began at" in body
    assert "Admission misses" in body and "none" in body
