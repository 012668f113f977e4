"""Workflows: atomic insert of a DAG, promotion by finalizes, failure policies,
dependency outputs on the claim, and the refusals that write nothing."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    BatchSettleParams,
    JobCancelParams,
    JobDependency,
    JobInsertParams,
    WorkflowInsertParams,
    WorkflowPromoteParams,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.models import Batch, Job
from django_hopper.models import JobDependency as DependencyModel
from django_hopper.types import DependencyFailure, JobRow
from tests.engine_conformance.support import claim, finalize, get, result

Q = "wfq"


def jobs(n: int, **fields: object) -> list[JobInsertParams]:
    return [JobInsertParams(kind=f"tests.step{i}", queue=Q, **fields) for i in range(n)]  # type: ignore[arg-type]


def diamond(
    engine: BaseEngine, now: dt.datetime, on_failure: str = DependencyFailure.CANCEL
) -> tuple:
    """a -> (b, c) -> d; d reads b and c."""
    result_ = engine.workflow_insert(
        WorkflowInsertParams(
            name="diamond",
            jobs=jobs(4),
            steps=["a", "b", "c", "d"],
            deps=[
                JobDependency(job=1, depends_on=0, reads=True),
                JobDependency(job=2, depends_on=0, on_failure=on_failure),
                JobDependency(job=3, depends_on=1, reads=True, on_failure=on_failure),
                JobDependency(job=3, depends_on=2, reads=True, on_failure=on_failure),
            ],
            on_complete=JobInsertParams(kind="tests.wf_done", queue="cb"),
            now=now,
        )
    )
    return result_.id, [r.job for r in result_.jobs]


def run(
    engine: BaseEngine, client_id: int, now: dt.datetime, state: str = "completed", **out: object
) -> list[JobRow]:
    """Claim everything claimable in the workflow queue and finalize it as ``state``."""
    claimed = claim(engine, client_id, now, queue=Q, limit=100)
    if claimed:
        finalize(engine, now, *[result(j, state, **out) for j in claimed])  # type: ignore[arg-type]
        settle_and_promote(engine, claimed, now)
    return claimed


def settle_and_promote(engine: BaseEngine, finished: Sequence[JobRow], now: dt.datetime) -> None:
    """What a client does after a finalize flush (the worker's job)."""
    promoted = engine.workflow_promote_ready(
        WorkflowPromoteParams(depends_on=tuple(j.id for j in finished), now=now)
    )
    batches = {j.batch_id for j in finished if j.batch_id} | set(promoted.batches)
    engine.batch_settle(BatchSettleParams(ids=tuple(batches), now=now))


def states(engine: BaseEngine, rows: Sequence[JobRow]) -> list[str]:
    return [get(engine, j).state for j in rows]


def test_workflow_insert__jobs_with_dependencies_start_pending(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    wf_id, (a, b, c, d) = diamond(engine, db_now)

    assert [j.state for j in (a, b, c, d)] == ["available", "pending", "pending", "pending"]
    assert states(engine, (a, b, c, d)) == ["available", "pending", "pending", "pending"]
    assert {j.batch_id for j in (a, b, c, d)} == {wf_id}
    assert [get(engine, j).step for j in (a, b, c, d)] == ["a", "b", "c", "d"]


def test_workflow_get__returns_batch_jobs_edges_and_steps(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    wf_id, (a, b, c, d) = diamond(engine, db_now)

    wf = engine.workflow_get(wf_id)

    assert wf is not None
    assert wf.batch.name == "diamond" and wf.batch.total == 4 and wf.batch.pending == 4
    assert [j.id for j in wf.jobs] == [a.id, b.id, c.id, d.id]
    assert {(e.job, e.depends_on) for e in wf.edges} == {
        (b.id, a.id), (c.id, a.id), (d.id, b.id), (d.id, c.id)
    }  # fmt: skip
    assert wf.steps == {a.id: "a", b.id: "b", c.id: "c", d.id: "d"}


def test_finalize__promotes_each_step_after_all_its_dependencies(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    wf_id, (a, b, c, d) = diamond(engine, db_now)

    order = [[j.id for j in run(engine, client_id, db_now, output={"n": 1})] for _ in range(4)]

    assert order == [[a.id], sorted([b.id, c.id]), [d.id], []]
    wf = engine.workflow_get(wf_id)
    assert wf is not None and wf.batch.completed_at is not None and wf.batch.pending == 0
    assert [j.state for j in wf.jobs] == ["completed"] * 4


def test_claim__a_reading_step_gets_its_dependencies_outputs(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    _, (a, b, c, d) = diamond(engine, db_now)
    (ca,) = claim(engine, client_id, db_now, queue=Q)
    assert ca.dependencies is None
    finalize(engine, db_now, result(ca, "completed", output="page"))
    settle_and_promote(engine, [ca], db_now)
    claimed = {j.id: j for j in claim(engine, client_id, db_now, queue=Q)}
    finalize(
        engine,
        db_now,
        result(claimed[b.id], "completed", output={"parsed": 1}),
        result(claimed[c.id], "completed", output=[2]),
    )
    settle_and_promote(engine, list(claimed.values()), db_now)

    (cd,) = claim(engine, client_id, db_now, queue=Q)

    assert [(x.id, x.state, x.output) for x in claimed[b.id].dependencies or []] == [
        (a.id, "completed", "page")
    ]
    assert claimed[c.id].dependencies is None  # c does not read a
    assert cd.id == d.id
    deps = {x.step: x for x in cd.dependencies or []}
    assert deps["b"].output == {"parsed": 1} and deps["c"].output == [2]
    assert [x.id for x in cd.dependencies or []] == sorted([b.id, c.id])


def test_failure__cancel_policy_cancels_dependents_down_the_graph(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    wf_id, (a, b, c, d) = diamond(engine, db_now)

    run(engine, client_id, db_now, state="discarded")

    assert states(engine, (a, b, c, d)) == ["discarded", "canceled", "canceled", "canceled"]
    errors = get(engine, d).errors
    assert errors and errors[-1].rescue == "dependency_failed"
    wf = engine.workflow_get(wf_id)
    assert wf is not None and wf.batch.completed_at is not None and wf.batch.failed == 4


def test_failure__discard_policy_discards_the_dependent(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    _, (a, b, c, d) = diamond(engine, db_now, on_failure=DependencyFailure.DISCARD)

    run(engine, client_id, db_now, state="canceled")

    # b's edge to a cancels (the default); c's discards; d follows c and b.
    assert states(engine, (a, b, c)) == ["canceled", "canceled", "discarded"]
    assert get(engine, d).state == "discarded"


def test_failure__run_policy_runs_the_dependent_and_shows_the_failed_state(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    result_ = engine.workflow_insert(
        WorkflowInsertParams(
            name="run-anyway",
            jobs=jobs(2),
            steps=["fetch", "cleanup"],
            deps=[JobDependency(1, 0, on_failure=DependencyFailure.RUN, reads=True)],
            now=db_now,
        )
    )
    _fetch, cleanup = (r.job for r in result_.jobs)

    run(engine, client_id, db_now, state="discarded")
    (claimed,) = claim(engine, client_id, db_now, queue=Q)

    assert claimed.id == cleanup.id
    assert [(x.step, x.state) for x in claimed.dependencies or []] == [("fetch", "discarded")]


def test_job_cancel__of_a_pending_step_cancels_its_dependents_and_counts(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    wf_id, (a, b, c, d) = diamond(engine, db_now)

    engine.job_cancel(JobCancelParams(id=b.id, now=db_now))
    run(engine, client_id, db_now)
    run(engine, client_id, db_now)

    assert states(engine, (a, b, c, d)) == ["completed", "canceled", "completed", "canceled"]
    wf = engine.workflow_get(wf_id)
    assert wf is not None and wf.batch.completed_at is not None and wf.batch.failed == 2


def test_workflow_promote_ready__the_sweep_is_idempotent(
    engine: BaseEngine, client_id: int, db_now: dt.datetime
) -> None:
    _, (_a, _b, _c, d) = diamond(engine, db_now)
    run(engine, client_id, db_now)

    swept = engine.workflow_promote_ready(WorkflowPromoteParams(now=db_now))

    assert swept.promoted == 0 and swept.failed == 0
    assert swept.scanned == 1 and swept.last == d.id  # d still waits for b and c
    assert engine.workflow_promote_ready(WorkflowPromoteParams(depends_on=())).promoted == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"deps": [JobDependency(0, 1), JobDependency(1, 2), JobDependency(2, 0)]}, "cycle"),
        ({"steps": ["x", "x", "y"]}, "used twice"),
        ({"steps": ["x"]}, "steps names 1 jobs"),
        ({"deps": [JobDependency(0, 7)]}, "two jobs of the workflow"),
        ({"deps": [JobDependency(0, 0)]}, "itself"),
        ({"deps": [JobDependency(1, 0, on_failure="explode")]}, "on_failure"),
        ({"jobs": jobs(3, unique_key="k")}, "unique key"),
        ({"name": ""}, "name"),
        ({"jobs": []}, "at least one job"),
    ],
)
def test_workflow_insert__refuses_an_invalid_workflow_writing_nothing(
    engine: BaseEngine, db_now: dt.datetime, change: dict, message: str
) -> None:
    fields: dict = {"name": "bad", "jobs": jobs(3), "now": db_now, **change}

    with pytest.raises(InvalidJob, match=message):
        engine.workflow_insert(WorkflowInsertParams(**fields))

    assert (Batch.objects.count(), Job.objects.count(), DependencyModel.objects.count()) == (
        0,
        0,
        0,
    )


def test_workflow_insert__ten_thousand_jobs_insert_in_one_call(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    n = 10_000
    deps = [JobDependency(i, i - 1) for i in range(1, n)]

    result_ = engine.workflow_insert(
        WorkflowInsertParams(name="big", jobs=jobs(1) * n, deps=deps, now=db_now)
    )

    assert len(result_.jobs) == n
    assert Job.objects.filter(state="pending").count() == n - 1
