"""Queues placed on several databases: a busy queue on a PostgreSQL of its own,
or an SQLite file beside PostgreSQL (``HOPPER["QUEUE_DATABASES"]``).

Enqueue writes each job through its queue's alias and joins that alias's
transaction; a worker process serves the queues of one alias (``--database``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import override_settings
from django.urls import reverse

import django_hopper
from django_hopper import api, queues
from django_hopper.engine import get_engine
from django_hopper.exceptions import InvalidJob, NotFound
from tests.support.runtime import Processes, wait_for
from tests.testapp import jobs
from tests.topology.conftest import POSTGRES

#: The second alias of each pass: another PostgreSQL database, and SQLite beside
#: it; on the SQLite pass, another SQLite file.
SECOND = ["second", "embedded"] if POSTGRES else ["second"]
ALL = ["default", *SECOND]

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=ALL),
    pytest.mark.skipif(
        bool(os.environ.get("HOPPER_TEST_PGBOUNCER_PORT")),
        reason="several databases run in the direct passes",
    ),
]


def placed(alias: str) -> Any:
    """The test settings with the queue "busy" placed on ``alias``."""
    from django.conf import settings

    return override_settings(
        HOPPER={
            **settings.HOPPER,
            "QUEUES": {"default": 2, "busy": 2},
            "QUEUE_DATABASES": {"busy": alias},
        }
    )


def on(alias: str, job_id: Any) -> bool:
    return get_engine(alias).job_get(job_id) is not None


@pytest.mark.parametrize("alias", SECOND)
def test_enqueue__a_placed_queue_is_written_on_its_alias(alias: str):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)
        plain = jobs.add.enqueue(3, 4)

        assert on(alias, busy.id) and not on("default", busy.id)
        assert on("default", plain.id) and not on(alias, plain.id)
        assert busy.refresh().queue == "busy"  # the handle reads its own alias


@pytest.mark.parametrize("alias", SECOND)
def test_enqueue__joins_the_transaction_of_its_queues_alias(alias: str):
    with placed(alias):
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            rolled_back = jobs.add.using(queue="busy").enqueue(1, 2)
            raise RuntimeError("roll back")
        with pytest.raises(RuntimeError), transaction.atomic(using="default"):
            kept = jobs.add.using(queue="busy").enqueue(1, 2)
            raise RuntimeError("another database's transaction")

        assert not on(alias, rolled_back.id)
        assert on(alias, kept.id)


@pytest.mark.parametrize("alias", SECOND)
def test_enqueue_many__each_job_lands_on_its_queues_alias_in_input_order(alias: str):
    with placed(alias):
        handles = django_hopper.enqueue_many(
            [
                jobs.add.using(queue="busy").prepare(1, 1),
                jobs.add.prepare(2, 2),
                jobs.add.using(queue="busy").prepare(3, 3),
            ]
        )

        assert [h.job.args["args"] for h in handles] == [[1, 1], [2, 2], [3, 3]]
        assert [on(alias, h.id) for h in handles] == [True, False, True]


@pytest.mark.parametrize("alias", SECOND)
def test_workflow__is_written_on_the_alias_of_its_queues(alias: str):
    from django_hopper import Workflow

    with placed(alias):
        wf = Workflow("placed")
        fetch = wf.add(jobs.wf_step.using(queue="busy"), "fetch", step="fetch")
        wf.add(jobs.wf_step.using(queue="busy"), "parse", after=[fetch], step="parse")
        handle = wf.enqueue()

        assert all(on(alias, h.id) and not on("default", h.id) for h in handle.jobs)


@pytest.mark.parametrize("alias", SECOND)
def test_workflow_and_batch__spanning_two_databases_are_refused_before_any_write(alias: str):
    from django_hopper import Batch, Workflow

    with placed(alias):
        wf = Workflow("split")
        wf.add(jobs.wf_step.using(queue="busy"), "a", step="a")
        wf.add(jobs.wf_step, "b", step="b")
        with pytest.raises(InvalidJob, match="must live on one database"):
            wf.enqueue()
        batch = Batch()
        batch.add(jobs.add.using(queue="busy"), 1, 2)
        batch.on_complete(jobs.add, 0, 0)  # the callback's queue is on DATABASE
        with pytest.raises(InvalidJob, match="'busy' on"):
            batch.enqueue()

        assert api.list_jobs() == []


def test_hopper_worker__refuses_a_queue_that_lives_on_another_database():
    with placed("second"), pytest.raises(CommandError, match="--database second"):
        call_command("hopper_worker", "--queues", "busy:2", "--burst")


def test_hopper_worker__serves_by_default_the_queues_of_its_database():
    from django_hopper.management.commands.hopper_worker import _queues_on

    with placed("second"):
        assert _queues_on("second", {"default": 2, "busy": 2}, explicit=False) == {"busy": 2}
        assert _queues_on("default", {"default": 2, "busy": 2}, explicit=False) == {"default": 2}


# -- the operator api and the admin follow the topology ---------------------------


@pytest.mark.parametrize("alias", SECOND)
def test_api__each_job_is_found_and_acted_on_on_its_queues_alias(alias: str):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)

        assert api.get_job(busy.id).queue == "busy"
        assert api.job_logs(busy.id) == []
        assert api.cancel_job(str(busy.id)).state == "canceled"
        assert get_engine(alias).job_get(busy.id).state == "canceled"
        assert api.retry_job(busy.id).state == "available"
        assert api.delete_job(busy.id).id == busy.id
        assert not on(alias, busy.id)
        with pytest.raises(NotFound):
            api.get_job(busy.id)


@pytest.mark.parametrize("alias", SECOND)
def test_api__using_names_the_alias_and_refuses_one_hopper_does_not_use(alias: str):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)

        assert api.get_job(busy.id, using=alias).id == busy.id
        with pytest.raises(NotFound):
            api.get_job(busy.id, using="default")
        with pytest.raises(InvalidJob, match="using must be an alias"):
            api.cancel_job(busy.id, using="nowhere")


@pytest.mark.parametrize("alias", SECOND)
def test_api_bulk__acts_on_every_alias_in_one_call(alias: str):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)
        plain = jobs.add.enqueue(3, 4)
        unknown = uuid.uuid4()

        result = api.cancel_jobs([busy.id, plain.id, unknown])

        assert result.outcomes == {busy.id: "canceled", plain.id: "canceled", unknown: "not_found"}
        assert get_engine(alias).job_get(busy.id).state == "canceled"
        assert get_engine("default").job_get(plain.id).state == "canceled"
        assert api.retry_jobs([busy.id, plain.id]).ids("retried") == [busy.id, plain.id]
        assert api.delete_jobs([busy.id, plain.id]).ids("deleted") == [busy.id, plain.id]


@pytest.mark.parametrize("alias", SECOND)
def test_erase_subject__erases_the_subject_on_every_alias(alias: str):
    with placed(alias):
        busy = jobs.add.using(queue="busy", subject="user:42").enqueue(1, 2)
        plain = jobs.add.using(subject="user:42").enqueue(3, 4)
        other = jobs.add.using(queue="busy", subject="user:7").enqueue(5, 6)

        record = api.erase_subject("user:42")

        assert record.jobs == 2
        assert get_engine(alias).job_get(busy.id).erased_at is not None
        assert get_engine("default").job_get(plain.id).erased_at is not None
        assert get_engine(alias).job_get(other.id).erased_at is None
        assert [r.jobs for r in api.subject_erasures("user:42")] == [1, 1]


@pytest.mark.parametrize("alias", SECOND)
def test_list_jobs__pages_through_every_alias_by_id_or_reads_one(alias: str):
    with placed(alias):
        ids = [
            (jobs.add.using(queue="busy") if i % 2 else jobs.add).enqueue(i, i).id for i in range(5)
        ]

        assert [j.id for j in api.list_jobs()] == ids
        first = api.list_jobs(limit=2)
        assert [j.id for j in first] == ids[:2]
        assert [j.id for j in api.list_jobs(after=first[-1].id, limit=2)] == ids[2:4]
        assert [j.id for j in api.list_jobs(newest_first=True, limit=3)] == ids[:1:-1]
        assert [j.id for j in api.list_jobs(queue="busy")] == ids[1::2]
        assert [j.id for j in api.list_jobs(using="default")] == ids[::2]


@pytest.mark.parametrize("alias", SECOND)
def test_queue_controls__act_where_the_queues_workers_read_them(alias: str):
    with placed(alias):
        queues.pause_queue("busy")
        queues.set_queue_limits("busy", global_limit=3)

        (row,) = [q for q in get_engine(alias).queue_list() if q.name == "busy"]
        assert row.paused_at is not None and row.limits.global_limit == 3
        assert "busy" not in {q.name for q in get_engine("default").queue_list()}
        listed = {q.name: q for q in queues.list_queues()}
        assert listed["busy"].paused_at is not None
        queues.resume_queue("busy")
        assert {q.name: q for q in queues.list_queues()}["busy"].paused_at is None


@pytest.mark.parametrize("alias", SECOND)
def test_stats__reads_each_queues_depth_on_its_alias(alias: str):
    with placed(alias):
        for i in range(3):
            jobs.add.using(queue="busy").enqueue(i, i)
        jobs.add.enqueue(1, 1)

        depths = queues.stats().queues
        assert depths["busy"].available == 3
        assert depths["default"].available == 1
        # Bounded, each alias's counts stop at the limit and say so.
        bounded = queues.stats(limit=2).queues
        assert (bounded["busy"].available, bounded["busy"].capped) == (2, ("available",))
        assert (bounded["default"].available, bounded["default"].capped) == (1, ())


@pytest.mark.parametrize("alias", SECOND)
def test_metrics_depth__a_scrape_reads_every_alias_and_closes_what_it_opened(alias: str):
    import threading

    from django_hopper.observability.metrics import QueueDepth

    with placed(alias):
        jobs.add.using(queue="busy").enqueue(1, 2)
        seen: dict[str, Any] = {}

        def scrape() -> None:  # as the Prometheus server does: a thread of its own
            stats = QueueDepth(max_age=0).read()
            seen["busy"] = stats.queues["busy"].available if stats else None
            seen["open"] = [a for a in ALL if connections[a].connection is not None]

        thread = threading.Thread(target=scrape)
        thread.start()
        thread.join()

        assert seen == {"busy": 1, "open": []}


@pytest.mark.parametrize("alias", SECOND)
def test_admin__lists_each_alias_by_its_database_choice(alias: str, admin_client: Any):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)
        plain = jobs.add.enqueue(3, 4)
        url = reverse("admin:django_hopper_job_changelist")

        main = admin_client.get(url).content.decode()
        assert str(plain.id) in main and str(busy.id) not in main
        assert f"?database={alias}" in main  # the database filter offers the other alias
        other = admin_client.get(url, {"database": alias}).content.decode()
        assert str(busy.id) in other and str(plain.id) not in other


@pytest.mark.parametrize("alias", SECOND)
def test_admin__job_page_and_actions_act_on_the_jobs_alias(alias: str, admin_client: Any):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)
        other = jobs.add.using(queue="busy").enqueue(5, 6)

        found = admin_client.get(reverse("admin:django_hopper_job_find", args=[busy.id]))
        assert found.status_code == 302
        assert found["Location"].endswith(f"?database={alias}")
        page = admin_client.get(found["Location"])
        assert page.status_code == 200 and str(busy.id) in page.content.decode()

        url = reverse("admin:django_hopper_job_changelist") + f"?database={alias}"
        admin_client.post(
            url, {"action": "cancel_jobs", "_selected_action": [str(busy.id)]}, follow=True
        )
        assert get_engine(alias).job_get(busy.id).state == "canceled"
        assert get_engine(alias).job_get(other.id).state == "available"

        act = reverse("admin:django_hopper_job_act", args=[other.id])
        admin_client.post(act, {"verb": "cancel"})
        assert get_engine(alias).job_get(other.id).state == "canceled"


@pytest.mark.parametrize("alias", SECOND)
def test_admin_queues__lists_and_resumes_a_placed_queue_on_its_alias(alias: str, admin_client: Any):
    with placed(alias):
        queues.pause_queue("busy")  # its row is on its alias
        url = reverse("admin:django_hopper_queue_changelist")

        assert ">busy<" not in admin_client.get(url).content.decode()
        assert ">busy<" in admin_client.get(url, {"database": alias}).content.decode()
        admin_client.post(
            f"{url}?database={alias}",
            {"action": "resume_queues", "_selected_action": ["busy"]},
            follow=True,
        )

        (row,) = [q for q in get_engine(alias).queue_list() if q.name == "busy"]
        assert row.paused_at is None


@pytest.mark.parametrize("alias", SECOND)
def test_admin__a_workflow_jobs_page_links_its_steps_on_their_alias(alias: str, admin_client: Any):
    from django_hopper import Workflow

    with placed(alias):
        wf = Workflow("linked")
        fetch = wf.add(jobs.wf_step.using(queue="busy"), "fetch", step="fetch")
        wf.add(jobs.wf_step.using(queue="busy"), "parse", after=[fetch], step="parse")
        handle = wf.enqueue()
        parse_id = handle.jobs[1].id

        url = reverse("admin:django_hopper_job_change", args=[parse_id])
        body = admin_client.get(url, {"database": alias}).content.decode()

        fetch_url = reverse("admin:django_hopper_job_change", args=[handle.jobs[0].id])
        assert f'href="{fetch_url}?database={alias}"' in body  # its dependency, on its alias


def clients_on(alias: str, *hostnames: str, lead: bool = True) -> list[int]:
    """Register live clients on ``alias``, the first elected its leader if ``lead``."""
    import datetime as dt

    from django_hopper.engine.params import ClientRegisterParams, LeaderParams

    engine = get_engine(alias)
    ttl = dt.timedelta(minutes=5)
    ids = [engine.client_register(ClientRegisterParams(hostname=h, ttl=ttl)) for h in hostnames]
    assert not lead or engine.leader_attempt(LeaderParams(client_id=ids[0], ttl=ttl))
    return ids


def test_admin_clients__offer_no_database_choice_with_one_alias(admin_client: Any):
    clients_on("default", "main-host")

    for name in ("client", "leader", "batch"):
        body = admin_client.get(reverse(f"admin:django_hopper_{name}_changelist")).content
        assert b"database=" not in body


@pytest.mark.parametrize("alias", SECOND)
def test_admin_clients__list_each_alias_clients_leader_and_running_jobs(
    alias: str, admin_client: Any
):
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from django_hopper.engine.params import JobClaimParams

    with placed(alias):
        clients_on("default", "main-host")
        (busy_client,) = clients_on(alias, "busy-host")
        busy = jobs.add.using(queue="busy").enqueue(1, 2)
        get_engine(alias).job_claim(JobClaimParams(queue="busy", client_id=busy_client, limit=1))
        url = reverse("admin:django_hopper_client_changelist")

        main = admin_client.get(url).content.decode()
        assert "main-host" in main and "busy-host" not in main
        assert f"?database={alias}" in main
        other = admin_client.get(url, {"database": alias}).content.decode()
        assert "busy-host" in other and "main-host" not in other
        running = f"?state=running&amp;attempted_by={busy_client}&amp;database={alias}"
        assert f'<a href="{reverse("admin:django_hopper_job_changelist")}{running}">1</a>' in other
        assert other.count('alt="True"') == 2  # live, and the leader of its database
        jobs_page = admin_client.get(
            reverse("admin:django_hopper_job_changelist"),
            {"state": "running", "attempted_by": busy_client, "database": alias},
        )
        assert str(busy.id) in jobs_page.content.decode()

        page = reverse("admin:django_hopper_client_change", args=[busy_client])
        detail = admin_client.get(page, {"database": alias})
        assert detail.status_code == 200 and "busy-host" in detail.content.decode()
        job_page = admin_client.get(
            reverse("admin:django_hopper_job_change", args=[busy.id]), {"database": alias}
        ).content.decode()
        assert f'href="{page}?database={alias}"' in job_page  # held by the client of its alias

        leaders = admin_client.get(
            reverse("admin:django_hopper_leader_changelist"), {"database": alias}
        ).content.decode()
        assert f'href="{page}?database={alias}"' in leaders

        def queries() -> int:
            with (
                CaptureQueriesContext(connections["default"]) as main_q,
                CaptureQueriesContext(connections[alias]) as other_q,
            ):
                assert admin_client.get(url, {"database": alias}).status_code == 200
            return len(main_q) + len(other_q)

        one = queries()
        clients_on(alias, "busy-2", "busy-3", lead=False)
        assert queries() == one  # one stats read for the page, whatever its rows


@pytest.mark.parametrize("alias", SECOND)
def test_admin_batches__show_and_act_on_a_workflow_on_its_alias(alias: str, admin_client: Any):
    from django.test.utils import CaptureQueriesContext

    from django_hopper import Workflow

    with placed(alias):
        wf = Workflow("placed-flow")
        fetch = wf.add(jobs.wf_step.using(queue="busy"), "fetch", step="fetch")
        wf.add(jobs.wf_step.using(queue="busy"), "parse", after=[fetch], step="parse")
        handle = wf.enqueue()
        url = reverse("admin:django_hopper_batch_changelist")

        assert str(handle.id) not in admin_client.get(url).content.decode()
        with CaptureQueriesContext(connections[alias]) as one:
            listed = admin_client.get(url, {"database": alias}).content.decode()
        assert str(handle.id) in listed
        more = [Workflow(f"more-{i}") for i in range(3)]
        for flow in more:
            flow.add(jobs.wf_step.using(queue="busy"), "x", step="x")
            flow.enqueue()
        with CaptureQueriesContext(connections[alias]) as four:
            assert admin_client.get(url, {"database": alias}).status_code == 200
        assert len(four) == len(one)  # the page's rows, read in one query whatever their number

        page = reverse("admin:django_hopper_batch_change", args=[handle.id])
        body = admin_client.get(page, {"database": alias}).content.decode()
        assert "open: 2 steps: 1 available, 1 pending" in body
        fetch_url = reverse("admin:django_hopper_job_change", args=[handle.jobs[0].id])
        assert f'href="{fetch_url}?database={alias}"' in body
        assert f"?batch_id={handle.id}&amp;database={alias}" in body
        act = reverse("admin:django_hopper_batch_act", args=[handle.id])
        assert f"{act}?database={alias}" in body

        done = admin_client.post(f"{act}?database={alias}", {"verb": "cancel_rest"})
        assert done["Location"] == f"{page}?database={alias}"
        assert {get_engine(alias).job_get(j.id).state for j in handle.jobs} == {"canceled"}

        job_page = admin_client.get(fetch_url, {"database": alias})
        if job_page.status_code == 302:  # the canceled step moved to history
            job_page = admin_client.get(job_page["Location"])
        assert f'href="{page}?database={alias}">workflow placed-flow' in job_page.content.decode()


class PlacedProcesses(Processes):
    """Worker processes that know every test database's name."""

    def env(self, overrides: dict[str, Any] | None = None) -> dict[str, str]:
        env = super().env(overrides)
        for alias in SECOND:
            env[f"HOPPER_TEST_{alias.upper()}_DB_NAME"] = str(
                connections[alias].settings_dict["NAME"]
            )
        return env


@pytest.mark.processes
@pytest.mark.parametrize("alias", SECOND)
def test_workers__one_per_database_run_the_queues_of_each(alias: str, tmp_path: Path):
    procs = PlacedProcesses(str(connections["default"].settings_dict["NAME"]), tmp_path)
    overrides = {"QUEUES": {"default": 2, "busy": 2}, "QUEUE_DATABASES": {"busy": alias}}
    try:
        with placed(alias):
            procs.start("--database", alias, overrides=overrides)
            procs.start(overrides=overrides)  # HOPPER["DATABASE"]: the queue "default"
            busy = [jobs.add.using(queue="busy").enqueue(i, 1) for i in range(5)]
            plain = [jobs.add.enqueue(i, 2) for i in range(5)]

            for handle in busy + plain:
                wait_for(lambda h=handle: h.refresh().state == "completed", timeout=90)
            assert [h.refresh().output for h in busy] == [i + 1 for i in range(5)]
            assert [h.refresh().output for h in plain] == [i + 2 for i in range(5)]
            assert all(p.poll() is None for p in procs.procs), procs.logs()
    finally:
        procs.kill_all()


@pytest.mark.parametrize("alias", SECOND)
def test_lease_job__takes_a_job_on_its_alias_in_that_alias_transaction(alias: str):
    with placed(alias):
        busy = jobs.add.using(queue="busy").enqueue(1, 2)

        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            with django_hopper.lease_job(busy.id) as lease:
                lease.complete(3)
            raise RuntimeError("roll back the alias's transaction")
        assert get_engine(alias).job_get(busy.id).state == "available"

        with transaction.atomic(using=alias), django_hopper.lease_job(busy.id) as lease:
            assert get_engine(alias).connection.in_atomic_block
            lease.complete(3)

        assert get_engine(alias).job_get(busy.id).state == "completed"
        with pytest.raises(NotFound):
            django_hopper.claim_job(busy.id, using="default")
