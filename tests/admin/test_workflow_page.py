"""The workflow page: the graph as SVG, a summary from the steps, retry failed / cancel the rest."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.test import Client as HttpClient
from django.urls import reverse

from django_hopper import api
from django_hopper.admin.graph import bar_chart, levels
from tests.test_admin_controls import two_step_workflow

pytestmark = pytest.mark.django_db


def page(client: HttpClient, batch_id: object) -> str:
    url = reverse("admin:django_hopper_batch_change", args=[batch_id])
    return client.get(url).content.decode()


def test_workflow_page__draws_the_graph_with_a_box_per_step_and_a_line_per_edge(
    admin_client: HttpClient,
) -> None:
    handle = two_step_workflow()
    body = page(admin_client, handle.id)
    svg = body[
        body.index('<svg class="hopper-dag"') : body.index("</svg>", body.index("hopper-dag"))
    ]
    assert svg.count("<rect") == 2 and svg.count("<line") == 1
    assert ">fetch</text>" in svg and ">parse</text>" in svg
    assert reverse("admin:django_hopper_job_find", args=[handle["fetch"].id]) in svg


def test_workflow_summary__counts_the_steps_as_they_are_after_a_retry(
    admin_client: HttpClient,
) -> None:
    handle = two_step_workflow()
    fetch, parse = handle["fetch"].id, handle["parse"].id
    api.cancel_job(parse)
    api.cancel_job(fetch)
    assert "finished: 2 steps: 2 canceled" in page(admin_client, handle.id)
    api.retry_job(parse)
    assert "open: 2 steps: 1 available, 1 canceled" in page(admin_client, handle.id)


def test_workflow_buttons__cancel_the_rest_then_retry_the_failed_steps(
    admin_client: HttpClient,
) -> None:
    handle = two_step_workflow()
    act = reverse("admin:django_hopper_batch_act", args=[handle.id])
    response = admin_client.post(act, {"verb": "cancel_rest"}, follow=True)
    msgs = [str(m) for m in get_messages(response.wsgi_request)]
    assert msgs == ["Cancel the rest of 2 jobs: 2 canceled."]
    assert {api.get_job(j.id).state for j in handle.jobs} == {"canceled"}
    admin_client.post(act, {"verb": "retry_failed"})
    assert {api.get_job(j.id).state for j in handle.jobs} <= {"available", "pending"}


def test_levels__put_each_step_one_column_after_its_longest_chain() -> None:
    a, b, c, d = "a", "b", "c", "d"
    got = levels([a, b, c, d], [(b, a), (c, b), (d, a), (c, d)])  # type: ignore[list-item]
    assert got == {a: 0, b: 1, d: 1, c: 2}


def test_bar_chart__draws_only_nonempty_bars_scaled_to_the_peak() -> None:
    svg = bar_chart([0, 2, 4], [0, 0, 4], width=30, height=10)
    assert svg.count("<rect") == 3
    assert 'class="bad"' in svg and "<script" not in svg
