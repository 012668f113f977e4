"""The admin's operator pages: queues (depths, pause, resume, limits), batches and
workflows, periodic jobs, clients and the leader. Actions go through the api."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib import admin as django_admin
from django.test import Client as HttpClient
from django.urls import reverse

from django_hopper import api, queues
from django_hopper.batches import Batch
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobInsertParams,
    LeaderParams,
    PeriodicInsertParams,
    PeriodicRegisterParams,
)
from django_hopper.periodic import define_periodic
from django_hopper.types import QueueRow
from django_hopper.workflows import Workflow, WorkflowHandle
from tests.test_admin import act
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db

MINUTE = dt.timedelta(minutes=1)


def queue(engine: BaseEngine, name: str) -> QueueRow:
    row = engine.queue_get(name)  # type: ignore[attr-defined]
    assert row is not None
    return row


def cell(body: str, column: str) -> list[str]:
    """Return the texts of a changelist column's cells, in row order."""
    found = re.findall(rf'<t([dh]) class="field-{column}[^"]*">(.*?)</t\1>', body, flags=re.S)
    return [re.sub(r"<[^>]+>", "", c).strip() for _, c in found]


def live_client(engine: BaseEngine, hostname: str = "web-1") -> int:
    return engine.client_register(ClientRegisterParams(hostname=hostname, ttl=dt.timedelta(1)))


def two_step_workflow() -> WorkflowHandle:
    wf = Workflow("import-42", metadata={"import": 42})
    fetch = wf.add(testjobs.add, 1, 2, step="fetch")
    wf.add(testjobs.add, 3, 4, step="parse", after=[fetch], reads=[fetch], on_failure="run")
    wf.on_complete(testjobs.noop)
    return wf.enqueue()


# -- queues -------------------------------------------------------------------


def test_queue_changelist__shows_live_depths_from_one_stats_read(
    admin_client: HttpClient, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.queue_ensure(["default", "emails", "idle"])
    testjobs.add.enqueue(1, 2)
    testjobs.add.enqueue(3, 4)
    testjobs.add.using(run_after=dt.timedelta(hours=1)).enqueue(5, 6)
    testjobs.send_email.enqueue("x@example.com")
    calls: list[int] = []
    real_stats = queues.stats

    def counting_stats(limit: int | None = None) -> Any:
        calls.append(1)
        assert limit is not None  # the page's read is the bounded one
        return real_stats(limit=limit)

    monkeypatch.setattr(queues, "stats", counting_stats)
    body = admin_client.get(reverse("admin:django_hopper_queue_changelist")).content.decode()
    assert cell(body, "name") == ["default", "emails", "idle"]
    assert cell(body, "available") == ["2", "1", "0"]
    assert cell(body, "scheduled") == ["1", "0", "0"]
    assert cell(body, "running") == ["0", "0", "0"]
    assert len(calls) == 1


def test_queue_changelist__shows_limits(admin_client: HttpClient, engine: BaseEngine) -> None:
    queues.set_queue_limits("default", rate_per_sec=5, burst=10, global_limit=3, aging=60)
    body = admin_client.get(reverse("admin:django_hopper_queue_changelist")).content.decode()
    assert cell(body, "rate") == ["5/s, burst 10"]
    assert cell(body, "global_limit") == ["3"]
    assert cell(body, "aging_text") == ["60s"]


def test_queue_actions__pause_and_resume_change_the_queue_through_the_api(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    engine.queue_ensure(["default", "emails"])
    msgs = act(admin_client, "queue", "pause_queues", ["default", "emails"])
    assert msgs == ["Pause 2 queues: 2 paused."]
    assert queue(engine, "default").paused_at is not None
    assert queue(engine, "emails").paused_at is not None
    act(admin_client, "queue", "resume_queues", ["emails"])
    assert queue(engine, "default").paused_at is not None
    assert queue(engine, "emails").paused_at is None


def test_queue_limits__the_form_sets_them_through_the_api(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    engine.queue_ensure(["default"])
    url = reverse("admin:django_hopper_queue_limits", args=["default"])
    assert admin_client.get(url).status_code == 200
    response = admin_client.post(
        url, {"rate_per_sec": "2.5", "burst": "", "global_limit": "4", "aging": "30"}
    )
    assert response.status_code == 302
    limits = queue(engine, "default").limits
    assert (limits.rate_per_sec, limits.global_limit, limits.partition_limit) == (2.5, 4, 0)
    assert limits.aging == dt.timedelta(seconds=30)
    # The form opens with the limits set, and blank removes them.
    assert 'value="4"' in admin_client.get(url).content.decode()
    admin_client.post(url, {})
    assert not queue(engine, "default").limits.limited


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"global_limit": "-1"}, "global_limit"),
        ({"rate_per_sec": "-0.5"}, "rate_per_sec"),
        ({"rate_per_sec": "1", "burst": "0"}, "burst"),
        ({"aging": "-3"}, "aging"),
    ],
)
def test_queue_limits__an_invalid_value_shows_the_api_error_and_changes_nothing(
    admin_client: HttpClient, engine: BaseEngine, data: dict[str, str], field: str
) -> None:
    queues.set_queue_limits("default", partition_limit=2)
    before = queue(engine, "default")
    url = reverse("admin:django_hopper_queue_limits", args=["default"])
    response = admin_client.post(url, data)
    assert response.status_code == 200
    body = response.content.decode()
    assert re.search(rf'errors field-{field}">\s*<ul class="errorlist', body), body
    assert "must be" in body  # the api's message, not a form rule
    after = queue(engine, "default")
    assert after.limits == before.limits and after.updated_at == before.updated_at


def test_queue_limits__action_opens_the_form_of_one_queue(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    engine.queue_ensure(["default", "emails"])
    url = reverse("admin:django_hopper_queue_changelist")
    response = admin_client.post(url, {"action": "set_limits", "_selected_action": ["emails"]})
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:django_hopper_queue_limits", args=["emails"])
    msgs = act(admin_client, "queue", "set_limits", ["default", "emails"])
    assert any("exactly one queue" in m for m in msgs), msgs


def test_queue_controls__need_change_permission(engine: BaseEngine, django_user_model: Any) -> None:
    from django.contrib.auth.models import Permission

    engine.queue_ensure(["default"])
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_queue"))
    http = HttpClient()
    http.force_login(user)
    body = http.get(reverse("admin:django_hopper_queue_changelist")).content.decode()
    assert "pause_queues" not in body
    act(http, "queue", "pause_queues", ["default"])
    assert queue(engine, "default").paused_at is None
    url = reverse("admin:django_hopper_queue_limits", args=["default"])
    assert http.post(url, {"global_limit": "1"}).status_code == 403
    assert queue(engine, "default").limits.global_limit == 0


def test_queue_detail__shows_depths_and_links_the_limits(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    engine.queue_ensure(["default"])
    testjobs.add.enqueue(1, 2)
    body = admin_client.get(
        reverse("admin:django_hopper_queue_change", args=["default"])
    ).content.decode()
    assert "available 1, scheduled 0" in body
    assert reverse("admin:django_hopper_queue_limits", args=["default"]) in body


# -- batches and workflows -----------------------------------------------------


def test_batch_pages__list_and_detail_show_progress_and_callbacks(
    admin_client: HttpClient,
) -> None:
    batch = Batch(metadata={"import": "march"})
    batch.add(testjobs.add, 1, 2)
    batch.add(testjobs.add, 3, 4)
    batch.on_success(testjobs.noop)
    handle = batch.enqueue()
    api.cancel_job(handle.jobs[0].id)

    url = reverse("admin:django_hopper_batch_changelist")
    body = admin_client.get(url).content.decode()
    assert str(handle.id) in body
    assert str(handle.id) in admin_client.get(url, {"completed": "no"}).content.decode()
    assert str(handle.id) not in admin_client.get(url, {"completed": "yes"}).content.decode()
    assert str(handle.id) not in admin_client.get(url, {"is_workflow__exact": "1"}).content.decode()
    assert str(handle.id) in admin_client.get(url, {"q": str(handle.id)}).content.decode()

    detail = admin_client.get(reverse("admin:django_hopper_batch_change", args=[handle.id]))
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "1 of 2 finished (1 canceled or discarded), 1 pending" in body  # folded by batch_get
    assert testjobs.noop.kind in body and "march" in body
    assert f"?batch_id={handle.id}" in body


def test_workflow_page__shows_steps_states_edges_and_links_each_job(
    admin_client: HttpClient,
) -> None:
    handle = two_step_workflow()
    fetch, parse = handle["fetch"].id, handle["parse"].id
    api.cancel_job(fetch)  # finished: linked in history

    url = reverse("admin:django_hopper_batch_changelist")
    body = admin_client.get(url, {"is_workflow__exact": "1"}).content.decode()
    assert "import-42" in body
    body = admin_client.get(
        reverse("admin:django_hopper_batch_change", args=[handle.id])
    ).content.decode()
    assert reverse("admin:django_hopper_jobhistory_change", args=[fetch]) in body
    parse_state = api.get_job(parse).state
    parse_admin = "jobhistory" if parse_state in ("completed", "canceled", "discarded") else "job"
    assert reverse(f"admin:django_hopper_{parse_admin}_change", args=[parse]) in body
    assert "on failure: run, reads" in body
    assert "<td>fetch</td>" in body and "<td>parse</td>" in body


def test_job_detail__links_its_workflow_and_shows_step_and_dependencies(
    admin_client: HttpClient,
) -> None:
    handle = two_step_workflow()
    fetch, parse = handle["fetch"].id, handle["parse"].id
    body = admin_client.get(
        reverse("admin:django_hopper_job_change", args=[parse])
    ).content.decode()
    assert reverse("admin:django_hopper_batch_change", args=[handle.id]) in body
    assert "workflow import-42" in body
    assert "Runs after" in body and reverse("admin:django_hopper_job_change", args=[fetch]) in body
    body = admin_client.get(
        reverse("admin:django_hopper_job_change", args=[fetch])
    ).content.decode()
    assert "Runs before" in body and reverse("admin:django_hopper_job_change", args=[parse]) in body


def test_job_detail__a_job_outside_batches_has_no_batch_section(
    admin_client: HttpClient,
) -> None:
    job_id = testjobs.add.enqueue(1, 2).id
    body = admin_client.get(
        reverse("admin:django_hopper_job_change", args=[job_id])
    ).content.decode()
    assert "Batch and workflow" not in body


# -- periodic jobs ---------------------------------------------------------------


def test_periodic_registrations__list_live_clients_with_schedule_and_digest(
    admin_client: HttpClient, engine: BaseEngine, db_now: dt.datetime
) -> None:
    alive = live_client(engine)
    expired = engine.client_register(
        ClientRegisterParams(hostname="gone", ttl=MINUTE, now=db_now - dt.timedelta(hours=1))
    )
    nightly = define_periodic(testjobs.noop, cron="0 3 * * *", tz="Europe/Paris", name="nightly")
    often = define_periodic(testjobs.noop, every=90, name="often")
    e: Any = engine
    e.periodic_register(
        PeriodicRegisterParams(alive, [nightly.registration(), often.registration()])
    )
    e.periodic_register(
        PeriodicRegisterParams(expired, [often.registration()], now=db_now - dt.timedelta(hours=1))
    )
    response = admin_client.get(reverse("admin:django_hopper_periodicregistration_changelist"))
    assert response.status_code == 200
    body = response.content.decode()
    assert cell(body, "name") == ["nightly", "often"]  # not the expired client's
    assert cell(body, "schedule") == ["cron 0 3 * * * (Europe/Paris)", "every 90s"]
    assert cell(body, "client") == [str(alive), str(alive)]
    digests = [d.registration().digest[:12] for d in (nightly, often)]
    assert cell(body, "short_digest") == digests


def test_periodic_slots__link_the_job_of_the_last_slot(
    admin_client: HttpClient, engine: BaseEngine, db_now: dt.datetime
) -> None:
    e: Any = engine
    job, inserted = e.periodic_insert(
        PeriodicInsertParams(
            name="nightly", slot=db_now, job=JobInsertParams(kind=testjobs.noop.kind), now=db_now
        )
    )
    assert inserted
    url = reverse("admin:django_hopper_periodicslot_changelist")
    body = admin_client.get(url).content.decode()
    assert reverse("admin:django_hopper_job_change", args=[job.id]) in body
    api.cancel_job(job.id)
    body = admin_client.get(url).content.decode()
    assert reverse("admin:django_hopper_jobhistory_change", args=[job.id]) in body
    detail = admin_client.get(reverse("admin:django_hopper_periodicslot_change", args=["nightly"]))
    assert detail.status_code == 200


# -- clients and the leader --------------------------------------------------------


def test_clients__show_the_leader_and_how_many_jobs_each_runs(
    admin_client: HttpClient, engine: BaseEngine
) -> None:
    leader = live_client(engine, "web-1")
    other = live_client(engine, "web-2")
    engine.leader_attempt(LeaderParams(client_id=leader, ttl=MINUTE))
    for i in range(3):
        testjobs.add.enqueue(i, i)
    engine.job_claim(JobClaimParams(queue="default", client_id=other, limit=2))
    body = admin_client.get(reverse("admin:django_hopper_client_changelist")).content.decode()
    assert cell(body, "id") == [str(other), str(leader)]  # newest first
    assert cell(body, "running") == ["2", "0"]
    assert f"attempted_by={other}" in body
    leads = re.findall(r'<td class="field-leads">(.*?)</td>', body, flags=re.S)
    assert ["icon-yes" in c for c in leads] == [False, True]
    running = admin_client.get(
        reverse("admin:django_hopper_job_changelist"),
        {"state": "running", "attempted_by": str(other)},
    ).content.decode()
    assert running.count('class="action-checkbox"') == 2

    body = admin_client.get(reverse("admin:django_hopper_leader_changelist")).content.decode()
    assert reverse("admin:django_hopper_client_change", args=[leader]) in body
    assert "icon-yes" in body  # the lease is live


# -- no writes through the ORM -----------------------------------------------------


def test_admin__no_hopper_model_can_be_added_or_deleted_through_the_orm(
    admin_client: HttpClient,
) -> None:
    models = [m for m in django_admin.site._registry if m._meta.app_label == "django_hopper"]
    assert {m._meta.model_name for m in models} >= {
        "job",
        "jobhistory",
        "queue",
        "batch",
        "client",
        "leader",
        "periodicregistration",
        "periodicslot",
        "resumablerun",
        "finishedrun",
    }
    for model in models:
        name = model._meta.model_name
        assert admin_client.get(reverse(f"admin:django_hopper_{name}_add")).status_code == 403
        changelist = admin_client.get(reverse(f"admin:django_hopper_{name}_changelist"))
        assert changelist.status_code == 200, name
        assert "delete_selected" not in changelist.content.decode(), name
