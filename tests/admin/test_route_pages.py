"""Admin pages of subscriptions, stream consumers and periodic jobs, and decode errors shown
on the job list and the job page."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client as HttpClient
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_hopper import api, append, consume, periodic, publish, subscribe
from django_hopper.engine.base import BaseEngine
from django_hopper.maintenance import PeriodicEnqueuer
from django_hopper.models import PeriodicRegistration, PeriodicSlot, StreamConsumer, Subscription
from django_hopper.periodic import define_periodic
from django_hopper.types import HELD_AT
from tests.engine_conformance.support import store_raw
from tests.maintenance.conftest import register_client
from tests.testapp import jobs as testjobs

pytestmark = pytest.mark.django_db


def act(client: HttpClient, model: str, action: str, names: list[str]) -> list[str]:
    url = reverse(f"admin:django_hopper_{model}_changelist")
    response = client.post(url, {"action": action, "_selected_action": names}, follow=True)
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


def page(client: HttpClient, url: str) -> tuple[str, int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode(), len(queries.captured_queries)


# -- subscriptions ------------------------------------------------------------------


def test_subscription_admin__pause_holds_resume_releases_and_each_action_is_logged(
    admin_client: HttpClient,
) -> None:
    subscribe("billing", "orders.*", testjobs.on_message, save=True)
    url = reverse("admin:django_hopper_subscription_changelist")

    assert act(admin_client, "subscription", "pause_subscriptions", ["billing"]) == [
        "Pause 1 subscription: 1 paused."
    ]
    assert "paused</strong> since" in page(admin_client, url)[0]
    publish("orders.created", {"id": 1})
    assert api.list_jobs(kinds=testjobs.on_message.kind)[0].scheduled_at == HELD_AT
    detail = reverse("admin:django_hopper_subscription_change", args=["billing"])
    assert "1 (released on resume)" in page(admin_client, detail)[0]

    msgs = act(admin_client, "subscription", "resume_subscriptions", ["billing"])
    assert msgs == ["Resume 1 subscription: 1 resumed.", "1 held deliveries released."]
    assert api.list_jobs(kinds=testjobs.on_message.kind)[0].scheduled_at < HELD_AT
    entries = LogEntry.objects.order_by("id")
    assert [(e.object_repr, e.object_id, e.action_flag) for e in entries] == [
        ("pause 1 subscription", "billing", CHANGE),
        ("resume 1 subscription", "billing", CHANGE),
    ]


@pytest.mark.parametrize(("cancel", "state"), [(False, "available"), (True, "canceled")])
def test_subscription_admin__delete_keeps_or_cancels_the_waiting_deliveries(
    admin_client: HttpClient, cancel: bool, state: str
) -> None:
    subscribe("audit", "#", testjobs.on_message, save=True)
    publish("orders.created", {"id": 1})
    action = "delete_subscriptions_cancel_pending" if cancel else "delete_subscriptions"

    msgs = act(admin_client, "subscription", action, ["audit"])

    assert msgs[0] == "Delete 1 subscription: 1 deleted."
    expected = "1 canceled" if cancel else "still run (0 held ones released)"
    assert expected in msgs[1]
    assert not Subscription.objects.exists()
    assert [j.state for j in api.list_jobs(kinds=testjobs.on_message.kind)] == [state]
    assert LogEntry.objects.get().action_flag == DELETION


def test_route_admins__view_only_users_see_the_pages_but_no_actions(
    django_user_model: Any,
) -> None:
    subscribe("billing", "orders.*", testjobs.on_message, save=True)
    consume("proj", "orders.#", testjobs.on_message, save=True)
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    for codename in ("view_subscription", "view_streamconsumer", "view_periodicregistration"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    http = HttpClient()
    http.force_login(user)
    for model in ("subscription", "streamconsumer", "periodicregistration"):
        body, _ = page(http, reverse(f"admin:django_hopper_{model}_changelist"))
        assert 'name="action"' not in body
    act(http, "subscription", "pause_subscriptions", ["billing"])
    assert Subscription.objects.get().paused_at is None


# -- stream consumers ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_consumer_admin__shows_lag_per_consumer_in_constant_queries(
    admin_client: HttpClient, tx_engine: BaseEngine
) -> None:
    for i in range(12):
        consume(f"c{i:02}", "orders.#" if i % 2 else "users.#", testjobs.on_message, save=True)
    for _ in range(3):
        append("orders.created", {})
    url = reverse("admin:django_hopper_streamconsumer_changelist")

    _, few = page(admin_client, url + "?q=c0")  # c00..c09
    body_all, many = page(admin_client, url)

    assert few == many  # one lag read for the page, whatever its size
    assert body_all.count('<td class="field-lag">3</td>') == 6
    assert body_all.count('<td class="field-lag">0</td>') == 6


@pytest.mark.django_db(transaction=True)
def test_consumer_admin__pause_reset_skip_and_delete(
    admin_client: HttpClient, tx_engine: BaseEngine
) -> None:
    consume("proj", "orders.#", testjobs.on_message, start="earliest", save=True)
    append("orders.created", {})
    assert tx_engine.stream_pump("proj", 10).delivered == 1

    assert act(admin_client, "streamconsumer", "pause_consumers", ["proj"]) == [
        "Pause 1 consumer: 1 paused."
    ]
    assert StreamConsumer.objects.get().paused_at is not None
    assert act(admin_client, "streamconsumer", "reset_consumers", ["proj"]) == [
        "Reset 1 consumer: 1 reset."
    ]
    act(admin_client, "streamconsumer", "resume_consumers", ["proj"])
    assert tx_engine.stream_pump("proj", 10).delivered == 1  # replayed from the earliest
    append("orders.created", {})
    act(admin_client, "streamconsumer", "skip_to_latest", ["proj"])
    assert tx_engine.stream_pump("proj", 10).delivered == 0
    msgs = act(admin_client, "streamconsumer", "delete_consumers_cancel_pending", ["proj"])
    assert msgs == [
        "Delete 1 consumer: 1 deleted.",
        "Their deliveries: 2 canceled (running ones finish).",
    ]
    assert not StreamConsumer.objects.exists()
    assert LogEntry.objects.count() == 5


# -- periodic jobs ------------------------------------------------------------------


@pytest.fixture
def daily(engine: BaseEngine) -> list[str]:
    """A daily job registered by two live clients (the admin lists a row per client), its
    slot always within its grace; returns the rows' keys."""
    kind = testjobs.noop.kind
    definition = define_periodic(kind, every=dt.timedelta(days=1), grace=dt.timedelta(days=2))
    now = engine.now()
    for _ in range(2):
        PeriodicEnqueuer(engine, register_client(engine, now), [definition]).register(now)
    return [str(pk) for pk in PeriodicRegistration.objects.values_list("pk", flat=True)]


def test_periodic_admin__run_now_takes_the_due_slot_then_runs_once_more(
    admin_client: HttpClient, daily: list[str]
) -> None:
    msgs = act(admin_client, "periodicregistration", "run_now", daily)  # one job, two rows
    assert msgs == ["Run now 1 periodic job: 1 started as the due slot."]
    assert act(admin_client, "periodicregistration", "run_now", daily[:1]) == [
        "Run now 1 periodic job: 1 started."
    ]
    assert act(admin_client, "periodicregistration", "run_now", daily[:1]) == [
        "Run now 1 periodic job: 1 already waiting or running."
    ]
    assert len(api.list_jobs(kinds=testjobs.noop.kind)) == 2
    body, _ = page(admin_client, reverse("admin:django_hopper_periodicregistration_changelist"))
    assert '<td class="field-enabled">yes</td>' in body


def test_periodic_admin__disable_and_enable(admin_client: HttpClient, daily: list[str]) -> None:
    name = testjobs.noop.kind
    assert act(admin_client, "periodicregistration", "disable", daily) == [
        "Disable 1 periodic job: 1 disabled."
    ]
    assert PeriodicSlot.objects.get(name=name).disabled_at is not None
    body, _ = page(admin_client, reverse("admin:django_hopper_periodicregistration_changelist"))
    assert "disabled</strong> since" in body and "none (disabled)" in body
    assert act(admin_client, "periodicregistration", "enable", daily) == [
        "Enable 1 periodic job: 1 enabled."
    ]
    state = PeriodicSlot.objects.get(name=name)
    assert state.disabled_at is None and state.enabled_at is not None
    assert periodic.periodic_states()[0].disabled_at is None


# -- decode errors ------------------------------------------------------------------


def test_job_admin__shows_why_a_row_does_not_decode_in_the_list_and_on_its_page(
    admin_client: HttpClient,
) -> None:
    healthy = testjobs.add.enqueue(1, 2).id
    bad = testjobs.add.enqueue(3, 4).id
    store_raw(bad, "metadata", "[1]")
    url = reverse("admin:django_hopper_job_changelist")

    body, _ = page(admin_client, url)

    assert body.count("does not decode: metadata: expected a JSON object") == 1
    detail, _ = page(admin_client, reverse("admin:django_hopper_job_change", args=[bad]))
    assert "Stored values that do not decode" in detail
    assert "metadata: expected a JSON object, not a list" in detail
    healthy_page, _ = page(admin_client, reverse("admin:django_hopper_job_change", args=[healthy]))
    assert "do not decode" not in healthy_page

    api.cancel_job(bad)  # to history: the history list says it too
    history, _ = page(admin_client, reverse("admin:django_hopper_jobhistory_changelist"))
    assert "does not decode: metadata" in history
