"""The Python API of workflows, batches and awaiting: what it refuses, what it writes,
and what a job sees of its dependencies."""

from __future__ import annotations

import asyncio

import pytest
from django.db import transaction

from django_hopper import Batch, Workflow, get_batch, get_workflow
from django_hopper.engine.base import BaseEngine
from django_hopper.exceptions import InvalidJob, JobFailed, NotFound
from django_hopper.models import Batch as BatchModel
from django_hopper.models import Job
from tests.support.runtime import Processes
from tests.testapp import jobs

Q = "wfapi"


def test_workflow__enqueue_writes_the_dag_in_the_callers_transaction(engine: BaseEngine) -> None:
    wf = Workflow("import-42", metadata={"import": 42})
    fetch = wf.add(jobs.wf_step.using(queue=Q), "fetch", step="fetch")
    wf.add(jobs.wf_step, "parse", after=[fetch], reads=["fetch"], step="parse")
    wf.on_complete(jobs.wf_callback, "done")

    with pytest.raises(RuntimeError), transaction.atomic():
        wf.enqueue()
        raise RuntimeError("roll back")
    assert Job.objects.count() == 0 and BatchModel.objects.count() == 0

    handle = wf.enqueue()
    row = get_workflow(handle.id)
    assert row.batch.name == "import-42" and row.batch.metadata == {"import": 42}
    assert [j.state for j in row.jobs] == ["available", "pending"]
    assert [(e.job, e.depends_on, e.reads) for e in row.edges] == [
        (handle["parse"].id, handle["fetch"].id, True)
    ]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda wf: wf.add(jobs.wf_step, "x", after=["missing"]), "no step named 'missing'"),
        (
            lambda wf: [wf.add(jobs.wf_step, "x", step="s"), wf.add(jobs.wf_step, "y", step="s")],
            "used twice",
        ),
        (
            lambda wf: wf.add(jobs.wf_step, "x", after=[Workflow("other").add(jobs.wf_step, "o")]),
            "same workflow",
        ),
        (lambda wf: wf.add(jobs.wf_step.using(unique_key="k"), "x"), "unique key"),
        (lambda wf: wf.add(jobs.wf_step, "x", on_failure="explode"), "on_failure"),
        (lambda wf: wf.add(jobs.wf_step, object()), "JSON"),
    ],
)
def test_workflow__refuses_a_bad_step_before_writing_anything(
    engine: BaseEngine, build: object, message: str
) -> None:
    wf = Workflow("bad")
    with pytest.raises(InvalidJob, match=message):
        build(wf)  # type: ignore[operator]
    assert Job.objects.count() == 0


def test_workflow__an_empty_workflow_is_refused(engine: BaseEngine) -> None:
    with pytest.raises(InvalidJob, match="at least one job"):
        Workflow("empty").enqueue()


def test_workflow__an_on_failure_key_that_is_not_a_dependency_is_refused(
    engine: BaseEngine,
) -> None:
    wf = Workflow("keys")
    fetch = wf.add(jobs.wf_step, "fetch", step="fetch")
    wf.add(jobs.wf_step, "other", step="other")

    with pytest.raises(InvalidJob, match="'other', which is not one of its dependencies"):
        wf.add(jobs.wf_step, "x", after=[fetch], on_failure={"fetch": "run", "other": "run"})
    wf.add(jobs.wf_step, "x", after=[fetch], on_failure={"fetch": "run"})  # a dependency: fine


def test_get_workflow__unknown_id_is_not_found(engine: BaseEngine) -> None:
    with pytest.raises(NotFound):
        get_workflow("01900000-0000-7000-8000-000000000000")
    with pytest.raises(InvalidJob, match="workflow_id"):
        get_workflow("nope")


def test_workflow__a_step_reads_its_dependencies_through_its_context(
    tx_engine: BaseEngine, make_worker: object
) -> None:
    wf = Workflow("reads")
    fn = jobs.wf_step.using(queue=Q)
    a = wf.add(fn, "a", step="a")
    wf.add(fn, "b", step="b", reads=[a])
    handle = wf.enqueue()
    worker = make_worker(queues={Q: 2})  # type: ignore[operator]

    worker.run_once()
    worker.wait_idle(5)
    worker.run_once()
    worker.wait_idle(5)

    assert handle["b"].refresh().output == {"name": "b", "reads": ["a"]}
    assert get_workflow(handle.id).batch.completed_at is not None


def test_batch__the_callback_runs_once_with_the_batch_id(
    tx_engine: BaseEngine, make_worker: object
) -> None:
    batch = Batch()
    batch.add(jobs.wf_step.using(queue=Q), "x")
    batch.add(jobs.wf_fail.using(queue=Q), "y")
    batch.on_success(jobs.wf_callback.using(queue=Q), "success")
    batch.on_failure(jobs.wf_callback.using(queue=Q), "failure")
    handle = batch.enqueue()
    worker = make_worker(queues={Q: 4})  # type: ignore[operator]

    for _ in range(3):
        worker.run_once()
        worker.wait_idle(5)

    row = get_batch(handle.id)
    assert (row.total, row.pending, row.failed) == (2, 0, 1) and row.completed_at
    from tests.testapp.models import Effect

    assert list(Effect.objects.filter(note__contains=":").values_list("note", flat=True)) == [
        f"failure:{handle.id}"
    ]


def test_batch__a_job_found_in_history_counts_and_the_batch_finishes_with_the_rest(
    tx_engine: BaseEngine, make_worker: object
) -> None:
    keyed = jobs.wf_step.using(queue=Q, unique_key="page-1", unique_finished=["completed"])
    keyed.enqueue("earlier")
    worker = make_worker(queues={Q: 4})  # type: ignore[operator]
    worker.run_once()
    worker.wait_idle(5)
    batch = Batch()
    batch.add(keyed, "again")
    batch.add(jobs.wf_step.using(queue=Q, unique_key="page-2"), "fresh")
    batch.on_success(jobs.wf_callback.using(queue=Q), "success")

    handle = batch.enqueue()

    assert [h.duplicate for h in handle.jobs] == [True, False]
    assert (handle.refresh().pending, handle.refresh().total) == (1, 2)
    for _ in range(3):
        worker.run_once()
        worker.wait_idle(5)
    row = get_batch(handle.id)
    assert (row.pending, row.failed) == (0, 0) and row.completed_at
    from tests.testapp.models import Effect

    assert Effect.objects.filter(note=f"success:{handle.id}").count() == 1


def test_batch__refuses_a_repeated_unique_key_and_empty_batches(engine: BaseEngine) -> None:
    batch = Batch()
    batch.add(jobs.wf_step.using(unique_key="k"), "x")
    with pytest.raises(InvalidJob, match=r"jobs\[1\] repeats the unique key 'k' of jobs\[0\]"):
        batch.add(jobs.wf_step.using(unique_key="k"), "y")
    with pytest.raises(InvalidJob, match="at least one job"):
        Batch().enqueue()


def test_workflow_and_batch__take_prepared_jobs_with_their_own_options(
    engine: BaseEngine,
) -> None:
    wf = Workflow("prepared")
    fetch = wf.add(jobs.wf_step.using(queue=Q, priority=4).prepare("fetch"), step="fetch")
    wf.add(jobs.wf_step.using(tags=["p"]).prepare("parse"), after=[fetch], step="parse")
    wf.on_complete(jobs.wf_callback.prepare("done"))
    handle = wf.enqueue()
    fetched, parsed = handle["fetch"].refresh(), handle["parse"].refresh()
    assert (fetched.queue, fetched.priority, fetched.args["args"]) == (Q, 4, ["fetch"])
    assert (parsed.state, parsed.tags) == ("pending", ["p"])

    batch = Batch()
    batch.add(jobs.wf_step.using(queue=Q).prepare("x"))
    batch.add(jobs.wf_step, "y")
    assert [h.job.queue for h in batch.enqueue().jobs] == [Q, "default"]


@pytest.mark.parametrize(
    "add",
    [
        lambda: Workflow("w").add(jobs.wf_step.prepare("x"), "extra"),
        lambda: Batch().add(jobs.wf_step.prepare("x"), name="extra"),
    ],
)
def test_workflow_and_batch__refuse_a_prepared_job_with_more_arguments(
    engine: BaseEngine, add: object
) -> None:
    with pytest.raises(InvalidJob):
        add()  # type: ignore[operator]
    assert Job.objects.count() == 0


def test_wait__returns_the_output_across_processes(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    handle = jobs.add.using(awaited=True).enqueue(2, 3)
    processes.start("--queues", "default:2")

    row = handle.wait(timeout=15)

    assert row.state == "completed" and row.output == 5


def test_wait__raises_job_failed_for_a_discarded_job(
    tx_engine: BaseEngine, processes: Processes
) -> None:
    handle = jobs.wf_fail.using(awaited=True).enqueue("boom")
    processes.start("--queues", "default:2")

    with pytest.raises(JobFailed) as info:
        handle.wait(timeout=15)

    assert info.value.job.state == "discarded"  # type: ignore[attr-defined]


def test_wait__times_out_while_no_worker_runs_it(tx_engine: BaseEngine) -> None:
    handle = jobs.noop.using(awaited=True).enqueue()

    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.3, poll_interval=0.05)


def test_await_result__is_the_async_twin(tx_engine: BaseEngine) -> None:
    handle = jobs.noop.enqueue()
    from django_hopper.api import cancel_job

    cancel_job(handle.id)

    with pytest.raises(JobFailed):
        asyncio.run(handle.await_result(timeout=2, poll_interval=0.05))
