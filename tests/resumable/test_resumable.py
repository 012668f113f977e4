"""@resumable: passes commit a cursor and drop the ledger, steps are memoized across
a crashed pass, duplicate step names are refused, and start() coalesces on instance."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_hopper.context import JobContext, JobSnooze
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalizeParams,
    JobPassTakeoverParams,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.jobs import resolve
from django_hopper.models import Job
from django_hopper.runs import (
    DuplicateStep,
    Pass,
    ProgressNotResumable,
    Run,
    claim_of,
    read_progress,
    resumable,
)
from django_hopper.types import Progress
from django_hopper.worker.execution import _call_args, completed, failed, fenced_to_claim, snoozed

CALLS: list[str] = []
HOUR = dt.timedelta(hours=1)


@resumable(queue="rs", max_attempts=3)
def walk(run: Run, n: int, crash_at: int | None = None) -> Pass:
    """Pass i runs steps s1..s3 over item i; crashes after s2 when told to."""
    i = run.cursor or 0

    def mk(name: str) -> Any:
        def fn() -> Any:
            CALLS.append(f"{i}:{name}")
            return {"item": i, "step": name, "t": (1, 2)}

        return fn

    first = run.step("s1", mk("s1"))
    run.step("s2", mk("s2"))
    if crash_at == i and sum(c == f"{i}:s3" for c in CALLS) == 0 and not CRASHED:
        CRASHED.append(i)
        raise RuntimeError("crash after s2")
    run.step("s3", mk("s3"))
    run.count("items")
    run.count("tuples_are_lists", 1 if first["t"] == [1, 2] else 0)
    return Pass(done=True) if i + 1 >= n else Pass(cursor=i + 1)


CRASHED: list[int] = []


@resumable(queue="rs")
def twice(run: Run) -> Pass:
    run.step("same", lambda: 1)
    run.step("same", lambda: 2)
    return Pass(done=True)


@resumable(queue="rs")
def keeps(run: Run) -> None:
    """Returns None: the cursor is kept and another pass follows."""
    run.count("n")


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    CRASHED.clear()


@pytest.fixture
def client_id(engine: BaseEngine) -> int:
    return engine.client_register(ClientRegisterParams(hostname="t", ttl=100 * HOUR))


def one_pass(engine: BaseEngine, client_id: int, now: dt.datetime | None = None) -> str:
    """Claim the queue's job and run one pass as the worker would; return how it ended."""
    (job,) = engine.job_claim(
        JobClaimParams(queue="rs", client_id=client_id, limit=1, now=now)
    ).jobs
    fn = resolve(job.kind)
    args, kwargs = _call_args(job)
    ctx = JobContext(job, engine)
    try:
        output = fn.func(ctx, *args, **kwargs)
    except JobSnooze as snooze:
        result, outcome = snoozed(job, snooze), "next"
    except Exception as exc:
        result, outcome = failed(job, str(exc)), "failed"
    else:
        result, outcome = completed(job, output, fn=fn), "done"
    result = fenced_to_claim(ctx, result)  # a pass that BEGAN holds a pass lease
    (applied,) = engine.job_finalize_many(JobFinalizeParams(jobs=[result], now=now))
    assert applied.id == job.id
    return outcome


def steps_of(engine: BaseEngine, job_id: Any) -> list[str]:
    return [s.step for s in engine.job_steps(job_id)]


def test_resumable__a_committed_pass_advances_the_cursor_and_drops_the_ledger(
    engine: BaseEngine, client_id: int
) -> None:
    handle = walk.start(n=3, instance="a")

    assert one_pass(engine, client_id) == "next"

    job = handle.refresh()
    assert job.state == "scheduled" and job.attempt == 0
    assert read_progress(job.progress) == (1, {"items": 1, "tuples_are_lists": 1}, 1, False)
    assert steps_of(engine, job.id) == []
    assert one_pass(engine, client_id) == "next"
    assert one_pass(engine, client_id) == "done"
    done = handle.refresh()
    assert done.state == "completed"
    assert done.output == {"cursor": 2, "counters": {"items": 3, "tuples_are_lists": 3}}
    assert [f"{i}:s{k}" for i in range(3) for k in (1, 2, 3)] == CALLS


def test_resumable__a_crashed_pass_keeps_its_steps_and_the_next_pass_skips_them(
    engine: BaseEngine, client_id: int
) -> None:
    handle = walk.start(n=2, crash_at=1, instance="b")
    assert one_pass(engine, client_id) == "next"
    CALLS.clear()

    assert one_pass(engine, client_id) == "failed"
    job = handle.refresh()
    assert job.state == "retryable" and job.attempt == 1
    assert steps_of(engine, job.id) == ["s1", "s2"]
    assert read_progress(job.progress)[0] == 1  # not advanced
    CALLS.clear()

    assert one_pass(engine, client_id, now=engine.now() + HOUR) == "done"
    assert CALLS == ["1:s3"]  # s1 and s2 were memoized
    assert handle.refresh().output["counters"] == {"items": 2, "tuples_are_lists": 2}


def test_resumable__a_step_name_twice_in_a_pass_is_refused(
    engine: BaseEngine, client_id: int
) -> None:
    twice.start(instance="x")

    (job,) = engine.job_claim(JobClaimParams(queue="rs", client_id=client_id, limit=1)).jobs
    with pytest.raises(DuplicateStep):
        twice.func(JobContext(job, engine))


def test_resumable__returning_none_keeps_the_cursor_and_commits_counters(
    engine: BaseEngine, client_id: int
) -> None:
    handle = keeps.start(instance="k")

    assert one_pass(engine, client_id) == "next"
    assert one_pass(engine, client_id) == "next"

    job = handle.refresh()
    assert read_progress(job.progress) == (None, {"n": 2}, 2, False)


def test_resumable__start_joins_the_live_run_and_a_finished_run_does_not_block(
    engine: BaseEngine, client_id: int
) -> None:
    first = walk.start(n=1, instance="c")
    again = walk.start(n=1, instance="c")
    other = walk.start(n=1, instance="d")

    assert again.duplicate and again.id == first.id
    assert not other.duplicate and other.id != first.id
    assert first.job.unique_key == f"{walk.kind}:c"

    while one_pass(engine, client_id) != "done" or first.refresh().is_live:
        pass
    fresh = walk.start(n=1, instance="c")
    assert not fresh.duplicate and fresh.id != first.id


def test_resumable__arguments_must_be_json(engine: BaseEngine) -> None:

    with pytest.raises(InvalidJob):
        walk.start(n=object(), instance="bad")


@pytest.mark.parametrize(
    ("name", "by", "field"), [(1, 1, "name"), ("", 1, "name"), ("x", 1.5, "by")]
)
def test_run_count__refuses_a_name_that_is_not_text_or_a_count_that_is_not_an_integer(
    engine: BaseEngine, client_id: int, name: Any, by: Any, field: str
) -> None:
    walk.start(n=1, instance="counts")
    (job,) = engine.job_claim(JobClaimParams(queue="rs", client_id=client_id, limit=1)).jobs
    context = JobContext(job, engine)
    run = Run(context, engine, claim_of(context))

    with pytest.raises(InvalidJob) as refused:
        run.count(name, by)

    assert refused.value.field == field and run.counters == {}


def test_resumable__a_crash_after_the_finishing_commit_repeats_no_step_and_no_count(
    engine: BaseEngine, client_id: int
) -> None:
    handle = walk.start(n=2, instance="crash-done")
    assert one_pass(engine, client_id) == "next"
    CALLS.clear()
    # The last pass commits (progress marked done, ledger dropped), then its
    # worker dies before the completion lands: its pass lease expires and the
    # next claim takes the run over, charging the attempt.
    (job,) = engine.job_claim(JobClaimParams(queue="rs", client_id=client_id, limit=1)).jobs
    args, kwargs = _call_args(job)
    output = resolve(job.kind).func(JobContext(job, engine), *args, **kwargs)
    assert CALLS == ["1:s1", "1:s2", "1:s3"]
    (taken,) = engine.job_pass_takeover_many(
        JobPassTakeoverParams(kinds=(walk.kind,), limit=10, max_misses=10, now=engine.now() + HOUR)
    )
    assert taken.began and handle.refresh().state == "retryable"
    CALLS.clear()

    assert one_pass(engine, client_id, now=engine.now() + 2 * HOUR) == "done"

    assert CALLS == []  # no step of the finished pass ran again
    done = handle.refresh()
    assert done.state == "completed"
    assert done.output == output == {"cursor": 1, "counters": {"items": 2, "tuples_are_lists": 2}}
    assert steps_of(engine, done.id) == []


LEASES: list[dt.timedelta] = []


class Died(BaseException):
    """The driving process dies mid-pass: nothing of hopper's runs after it."""


@resumable(queue="rs-lease", lease=90)
def leased(run: Run, n: int, die_at: int | None = None) -> Pass:
    """Records the lease it runs under; dies after its first step when told to."""
    from django_hopper.engine import get_engine

    i = run.cursor or 0
    run.step("a", lambda: CALLS.append(f"{i}:a"))
    engine = get_engine()
    job = engine.job_get(run.job_id)
    assert job is not None and job.lease_expires_at is not None
    LEASES.append(job.lease_expires_at - engine.now())  # renewed by the step just taken
    if die_at == i and not CRASHED:
        CRASHED.append(i)
        raise Died
    run.step("b", lambda: CALLS.append(f"{i}:b"))
    run.count("items")
    return Pass(done=True) if i + 1 >= n else Pass(cursor=i + 1)


def test_resumable__drive_runs_each_pass_under_a_job_lease_of_the_declared_ttl(
    engine: BaseEngine,
) -> None:
    LEASES.clear()
    handle = leased.start(n=2, instance="lease")

    assert leased.drive(handle.id) == "next"
    assert handle.refresh().state == "scheduled"  # committed: the next pass is due
    assert leased.drive(handle.id) == "done"

    assert len(LEASES) == 2
    assert all(dt.timedelta(seconds=80) < left <= dt.timedelta(seconds=90) for left in LEASES)
    done = handle.refresh()
    assert done.state == "completed" and done.output == {"cursor": 1, "counters": {"items": 2}}
    assert CALLS == ["0:a", "0:b", "1:a", "1:b"]


def test_resumable__a_driven_pass_that_died_is_taken_over_once_its_lease_expires(
    engine: BaseEngine, client_id: int
) -> None:
    from django_hopper.engine.params import JobExpireLeasesParams

    handle = leased.start(n=1, die_at=0, instance="died")
    with pytest.raises(Died):
        leased.drive(handle.id)
    assert handle.refresh().state == "running"
    (expired,) = engine.job_expire_leases(
        JobExpireLeasesParams(
            limit=10, client_id=client_id, now=engine.now() + dt.timedelta(minutes=10)
        )
    )
    assert expired.state == "retryable"
    CALLS.clear()

    assert leased.drive(handle.id) == "done"
    assert CALLS == ["0:b"]  # step a was memoized under the dead pass's lease


def test_resumable__lease_must_be_a_positive_duration() -> None:

    with pytest.raises(InvalidJob, match="lease"):
        resumable(lease=0, kind="tests.bad_lease")


# -- progress that a committed pass did not write ----------------------------------------

COMMITTED = {"cursor": 7, "counters": {"rows": 3}, "passes": 2}


@pytest.mark.parametrize(
    ("step", "cursor"),
    [
        ("import", 4200),
        ("import", {"step": "import", "cursor": 4200}),
        ("pass", 4200),
        ("pass", {"cursor": 7}),
        ("pass", {**COMMITTED, "counters": {"rows": "3"}}),
        ("pass", {**COMMITTED, "counters": [1]}),
        ("pass", {**COMMITTED, "passes": 0}),
        ("pass", {**COMMITTED, "passes": True}),
        ("pass", {**COMMITTED, "done": "yes"}),
        ("other", COMMITTED),
    ],
)
def test_read_progress__refuses_what_a_committed_pass_did_not_write(
    step: str, cursor: object
) -> None:
    with pytest.raises(ProgressNotResumable, match="Refusing to restart the walk"):
        read_progress(Progress(step=step, cursor=cursor))  # type: ignore[arg-type]


def test_read_progress__reads_a_committed_pass_and_no_progress_as_the_start() -> None:
    assert read_progress(None) == (None, {}, 0, False)
    assert read_progress(Progress(step="pass", cursor=COMMITTED)) == (7, {"rows": 3}, 2, False)
    assert read_progress(Progress(step="pass", cursor={**COMMITTED, "done": True}))[3] is True


def set_progress(job_id: Any, step: str, cursor: object) -> None:
    Job.objects.filter(id=job_id).update(progress={"step": step, "cursor": cursor, "at": None})


def test_resumable__progress_without_the_run_wrapper_fails_the_pass_and_runs_no_step(
    engine: BaseEngine, client_id: int
) -> None:
    handle = walk.start(n=3, instance="foreign")
    set_progress(handle.id, "import", {"step": "import", "cursor": 4200})

    assert one_pass(engine, client_id) == "failed"

    job = handle.refresh()
    assert CALLS == []  # the walk did not restart from scratch
    assert job.state == "retryable"
    assert "is not a committed pass of a resumable run" in job.errors[-1].error
    assert job.progress is not None and job.progress.step == "import"  # left as found


def test_resumable__a_driven_pass_refuses_progress_without_the_run_wrapper(
    engine: BaseEngine,
) -> None:
    handle = leased.start(n=2, instance="foreign-drive")
    set_progress(handle.id, "import", 4200)

    assert leased.drive(handle.id) == "failed"

    assert CALLS == []
    assert "is not a committed pass" in handle.refresh().errors[-1].error


@resumable(queue="rs")
def records_progress(run: Run) -> Pass:
    run.context.record_progress("mine", 1)
    return Pass(done=True)


def test_resumable__a_pass_cannot_overwrite_its_cursor_with_record_progress(
    engine: BaseEngine, client_id: int
) -> None:
    handle = records_progress.start(instance="own")

    assert one_pass(engine, client_id) == "failed"

    job = handle.refresh()
    assert "progress belongs to its resumable run" in job.errors[-1].error
    assert job.progress is None


@resumable(queue="rs-lease", lease=90)
def logs_a_line(run: Run) -> Pass:
    run.context.log(f"pass {run.passes}")
    return Pass(done=run.passes >= 1)


def test_resumable__drive_takes_the_id_as_a_string_and_keeps_the_log_lines(
    engine: BaseEngine,
) -> None:
    from django_hopper.api import job_logs

    handle = logs_a_line.start(instance="logs")

    assert logs_a_line.drive(str(handle.id)) == "next"
    assert logs_a_line.drive(str(handle.id)) == "done"

    assert [(entry.attempt, entry.log) for entry in job_logs(handle.id)] == [
        (1, "pass 0\n"),
        (1, "pass 1\n"),
    ]


def test_resumable__drive_refuses_an_id_that_is_not_a_uuid_naming_the_field() -> None:
    with pytest.raises(InvalidJob) as exc:
        logs_a_line.drive("not-a-uuid")
    assert exc.value.field == "job_id"
