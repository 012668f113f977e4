"""Pass leases of resumable runs through the public API: every pass BEGINs under a
lease, a claim that never began is an admission miss (no attempt), a step has its
own retry budget across passes, a run needs no instance, and a bounded driver
drives due runs with a limit and a deadline."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import DatabaseError
from django.test import override_settings

import django_hopper as hopper
from django_hopper.context import AttemptSettled, JobContext, JobSnooze
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalizeParams,
    JobPassTakeoverParams,
)
from django_hopper.exceptions import InvalidJob, JobCanceled, JobFenced
from django_hopper.jobs import resolve
from django_hopper.maintenance.services import Rescuer
from django_hopper.runs import (
    DEFAULT_INSTANCE,
    Pass,
    Run,
    StepExhausted,
    begin_pass,
    drive_due,
    list_runs,
    resumable,
)
from django_hopper.types import JobState, RescueReason
from django_hopper.validation import PASS_LEASE_MIN
from django_hopper.worker.execution import (
    _call_args,
    _error_outcome,
    completed,
    fenced_to_claim,
    snoozed,
)
from django_hopper.worker.producer import Producer

HOUR = dt.timedelta(hours=1)
SECOND = dt.timedelta(seconds=1)
CALLS: list[str] = []
SEEN: list[Any] = []


@resumable(queue="pl", lease=60, max_attempts=5)
def paged(run: Run, n: int = 2) -> Pass:
    """One item per pass; records the pass lease it runs under."""
    from django_hopper.engine import get_engine

    i = run.cursor or 0
    SEEN.append(get_engine().job_pass_get(run.job_id))
    run.step("item", lambda: CALLS.append(f"{i}"))
    run.count("items")
    return Pass(done=True) if i + 1 >= n else Pass(cursor=i + 1)


@resumable(queue="pl-budget", max_attempts=5)
def flaky(run: Run, budget: int | None = 2) -> Pass:
    run.step("ok", lambda: CALLS.append("ok"))

    def boom() -> None:
        CALLS.append("boom")
        raise RuntimeError("upstream down")

    run.step("boom", boom, max_attempts=budget)
    return Pass(done=True)


@resumable(queue="pl-single")
def single(run: Run) -> Pass:
    return Pass(done=True)


@resumable(queue="pl-cancels")
def cancels(run: Run) -> Pass:
    run.step("before", lambda: CALLS.append("before"))
    raise JobCanceled("the source was withdrawn")


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()


@pytest.fixture
def client_id(engine: BaseEngine) -> int:
    return engine.client_register(ClientRegisterParams(hostname="t", ttl=100 * HOUR))


def worker_pass(engine: BaseEngine, client_id: int, queue: str, now: Any = None) -> str:
    """Claim the queue's run and run one pass as the worker does; return how it ended."""
    (job,) = engine.job_claim(
        JobClaimParams(queue=queue, client_id=client_id, limit=1, now=now)
    ).jobs
    fn = resolve(job.kind)
    args, kwargs = _call_args(job)
    ctx = JobContext(job, engine)
    try:
        output = fn.func(ctx, *args, **kwargs)
    except AttemptSettled:
        return "missed"
    except JobSnooze as snooze:
        result, outcome = snoozed(job, snooze), "next"
    except Exception as exc:

        class _Ex:  # the executor's view of the attempt, for its outcome rule
            pass

        ex: Any = _Ex()
        ex.job, ex.context, ex.exception, ex.settled_state = job, ctx, None, ""
        ex.log = __import__("logging").getLogger("t")
        decided = _error_outcome(ex, exc)
        assert decided is not None
        result, outcome = decided, ("discarded" if decided.state == "discarded" else "failed")
    else:
        result, outcome = completed(job, output, fn=fn), "done"
    (applied,) = engine.job_finalize_many(
        JobFinalizeParams(jobs=[fenced_to_claim(ctx, result)], now=now)
    )
    assert applied.id == job.id
    return outcome


# -- the lease floor --------------------------------------------------------------


@pytest.mark.parametrize("lease", [1e-6, 0.5, dt.timedelta(milliseconds=999)])
def test_resumable__refuses_a_lease_below_the_floor_naming_it(lease: Any) -> None:
    with pytest.raises(InvalidJob, match="at least 1 second") as info:
        resumable(lease=lease, kind="tests.too_short")
    assert info.value.field == "lease"


def test_resumable__accepts_a_lease_at_the_floor() -> None:
    rj = resumable(lambda run: None, lease=PASS_LEASE_MIN, kind="tests.at_floor")
    assert rj.lease == PASS_LEASE_MIN


# -- every pass holds a pass lease --------------------------------------------------


def test_worker_pass__begins_under_a_pass_lease_renewed_at_each_step(
    engine: BaseEngine, client_id: int
) -> None:
    handle = paged.start(n=2, instance="lease")

    assert worker_pass(engine, client_id, "pl") == "next"

    (state,) = SEEN
    assert state.began_at is not None and state.admission_misses == 0
    assert state.lease_expires_at - state.began_at == 60 * SECOND
    job = handle.refresh()
    assert job.state == JobState.SCHEDULED and job.attempt == 0
    assert worker_pass(engine, client_id, "pl") == "done"
    assert handle.refresh().output == {"cursor": 1, "counters": {"items": 2}}


def test_worker_pass__a_hung_pass_is_taken_over_by_the_next_claim_once_its_lease_expires(
    engine: BaseEngine, client_id: int
) -> None:
    handle = paged.start(n=1, instance="hung")
    (job,) = engine.job_claim(JobClaimParams(queue="pl", client_id=client_id, limit=1)).jobs
    ctx = JobContext(job, engine)
    from django_hopper.runs import begin_pass

    begin_pass(engine, ctx, paged.lease)  # BEGIN, then the pass hangs: no step, no renewal

    later = engine.now() + 61 * SECOND
    producer = Producer(
        "pl", 1, engine=engine, control=None, start_job=None,  # type: ignore[arg-type]
        poll_interval=1.0, claim_debounce=0.0,
    )  # fmt: skip
    assert producer.take_over(0.0, db_now=later) == 1  # what its producer does at a claim
    assert worker_pass(engine, client_id, "pl", now=later) == "done"

    done = handle.refresh()
    assert done.state == JobState.COMPLETED
    assert [e.rescue for e in done.errors] == [RescueReason.LEASE_EXPIRED]


def test_job_lease_on_a_run__unbegun_at_expiry_is_taken_over_as_a_miss_and_its_holder_fenced(
    engine: BaseEngine, client_id: int
) -> None:
    handle = paged.start(n=1, instance="leased")
    # A request takes the run by ID with the public job lease and never begins a pass.
    lease = hopper.claim_job(handle.id, lease=1)
    later = lease.expires_at + SECOND
    with pytest.raises(InvalidJob, match="resumable run") as refused:
        lease.record_progress("page", 3)  # would overwrite where the run resumes
    assert refused.value.field == "progress" and handle.refresh().progress is None
    producer = Producer(
        "pl", 1, engine=engine, control=None, start_job=None,  # type: ignore[arg-type]
        poll_interval=1.0, claim_debounce=0.0,
    )  # fmt: skip

    assert producer.take_over(0.0, db_now=later) == 1

    # No pass ran under that lease: an admission miss, no attempt charged, no grace.
    job = handle.refresh()
    assert (job.state, job.attempt, job.errors) == (JobState.SCHEDULED, 0, [])
    assert job.snooze_reason is not None and "admission miss 1/10" in job.snooze_reason
    with pytest.raises(JobFenced):
        lease.complete({"late": True})
    assert worker_pass(engine, client_id, "pl", now=later + HOUR) == "done"
    done = handle.refresh()
    assert (done.state, done.attempt, done.errors) == (JobState.COMPLETED, 1, [])
    assert done.output == {"cursor": None, "counters": {"items": 1}}


def test_producer__claims_even_when_taking_over_expired_pass_leases_fails(
    engine: BaseEngine, client_id: int, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    handle = paged.start(n=1, instance="takeover-fails")

    def fails(params: JobPassTakeoverParams) -> list[Any]:
        raise DatabaseError("the takeover failed")

    monkeypatch.setattr(engine, "job_pass_takeover_many", fails)
    started: list[Any] = []
    control: Any = SimpleNamespace(
        may_claim_from=lambda queue: True, client_id=client_id, limited_queues=set()
    )
    producer = Producer(
        "pl", 1, engine=engine, control=control,
        start_job=lambda job, _producer: started.append(job.id),
        poll_interval=1.0, claim_debounce=0.0,
    )  # fmt: skip

    assert producer.claim_once() == 1

    assert started == [handle.id]
    assert "claiming anyway" in caplog.text


@pytest.mark.parametrize(
    ("takeover_after", "order", "wakes"),
    [(False, ["takeover", "claim"], False), (True, ["claim", "takeover"], True)],
)
def test_producer__its_loop_claims_before_the_takeover_and_claims_again_after_one(
    engine: BaseEngine,
    client_id: int,
    monkeypatch: pytest.MonkeyPatch,
    takeover_after: bool,
    order: list[str],
    wakes: bool,
) -> None:
    # The producer's own loop (takeover_after) sends a wake-up's claim before the
    # takeover's round trips, and claims again at once when a run was taken over.
    handle = paged.start(n=1, instance="takeover-order")
    calls: list[str] = []
    claim = engine.job_claim

    def claiming(params: JobClaimParams) -> Any:
        calls.append("claim")
        return claim(params)

    def taking_over(params: JobPassTakeoverParams) -> list[Any]:
        calls.append("takeover")
        return [SimpleNamespace(id=handle.id, began=True, misses=0)]

    monkeypatch.setattr(engine, "job_claim", claiming)
    monkeypatch.setattr(engine, "job_pass_takeover_many", taking_over)
    started: list[tuple[Any, list[str]]] = []
    control: Any = SimpleNamespace(
        may_claim_from=lambda queue: True, client_id=client_id, limited_queues=set()
    )
    producer = Producer(
        "pl", 1, engine=engine, control=control,
        start_job=lambda job, _producer: started.append((job.id, list(calls))),
        poll_interval=1.0, claim_debounce=0.0,
    )  # fmt: skip

    assert producer.claim_once(takeover_after=takeover_after) == 1

    assert calls == order
    assert started == [(handle.id, order[: order.index("claim") + 1])]
    assert producer.wake.is_set() is wakes


# -- admission misses ---------------------------------------------------------------


def test_worker_pass__a_claim_with_too_little_lease_left_misses_and_costs_no_attempt(
    engine: BaseEngine, client_id: int
) -> None:
    handle = paged.start(n=1, instance="late")
    # Claimed 50 s ago: 10 s of the 60 s lease left, under the 15 s margin.
    claimed_at = engine.now() - 50 * SECOND

    assert worker_pass(engine, client_id, "pl", now=claimed_at) == "missed"

    assert CALLS == [] and SEEN == []  # the handler never ran
    job = handle.refresh()
    assert job.state == JobState.SCHEDULED and job.attempt == 0 and job.errors == []
    assert job.snooze_reason is not None and "admission miss 1/10" in job.snooze_reason
    state = paged.pass_state(str(job.id))
    assert state is not None and (state.admission_misses, state.began_at) == (1, None)


def test_list_runs__shows_a_live_runs_admission_misses_and_its_pass_lease(
    engine: BaseEngine, client_id: int
) -> None:
    missed = paged.start(n=1, instance="listed-missed")
    assert worker_pass(engine, client_id, "pl", now=engine.now() - 50 * SECOND) == "missed"
    held = paged.start(n=1, instance="listed-begun")
    (job,) = engine.job_claim(JobClaimParams(queue="pl", client_id=client_id, limit=1)).jobs
    assert job.id == held.id
    begin_pass(engine, JobContext(job, engine), paged.lease)

    runs = {r.id: r for r in list_runs(kinds=paged.kind)}

    m, h = runs[missed.id], runs[held.id]
    assert (m.admission_misses, m.pass_began_at) == (1, None)
    assert h.admission_misses == 0 and h.pass_began_at is not None
    assert h.lease_expires_at is not None
    assert h.lease_expires_at - h.pass_began_at == paged.lease


def test_begin__three_misses_in_a_row_do_not_discard_a_run_under_the_default_bound(
    engine: BaseEngine, client_id: int
) -> None:
    from django_hopper.runs import begin_pass

    handle = paged.start(n=1, instance="three")
    for k in range(1, 4):
        at = engine.now() + k * HOUR
        (job,) = engine.job_claim(
            JobClaimParams(queue="pl", client_id=client_id, limit=1, now=at)
        ).jobs
        with pytest.raises(AttemptSettled):
            begin_pass(engine, JobContext(job, engine), paged.lease, waited=59.0)

    job = handle.refresh()
    assert job.state == JobState.SCHEDULED and job.attempt == 0 and job.errors == []
    assert paged.pass_state(job.id).admission_misses == 3  # type: ignore[union-attr]
    assert worker_pass(engine, client_id, "pl", now=engine.now() + 5 * HOUR) == "done"
    assert handle.refresh().state == JobState.COMPLETED


@override_settings(HOPPER={"ADMISSION_MISS_MAX": 3})
def test_begin__misses_keep_the_run_waiting_and_the_bound_fails_it_with_the_reason(
    engine: BaseEngine, client_id: int
) -> None:
    from django_hopper.runs import begin_pass

    handle = paged.start(n=1, instance="bound")
    for k in range(1, 4):
        at = engine.now() + k * HOUR  # past the run's backoff
        (job,) = engine.job_claim(
            JobClaimParams(queue="pl", client_id=client_id, limit=1, now=at)
        ).jobs
        with pytest.raises(AttemptSettled):
            # The claim's reply took 59 s of its 60 s lease: the pass does not begin.
            begin_pass(engine, JobContext(job, engine), paged.lease, waited=59.0)
        if k < 3:
            assert handle.refresh().state == JobState.SCHEDULED
            assert handle.refresh().attempt == 0

    failed_run = handle.refresh()
    assert failed_run.state == JobState.DISCARDED
    assert failed_run.errors[-1].rescue == RescueReason.ADMISSION_MISSED
    assert "lease too short for this environment: 3 consecutive" in failed_run.errors[-1].error
    assert "came back after 59.000s" in failed_run.errors[-1].error
    assert CALLS == []


def test_rescue__a_worker_that_died_before_begin_is_an_admission_miss_not_an_attempt(
    engine: BaseEngine,
) -> None:
    handle = paged.start(n=1, instance="died-before")
    short = engine.client_register(ClientRegisterParams(hostname="t", ttl=10 * SECOND))
    engine.job_claim(JobClaimParams(queue="pl", client_id=short, limit=1))

    assert Rescuer(engine, stuck_after=0).run_once(now=engine.now() + HOUR) == 1

    job = handle.refresh()
    assert job.state == JobState.SCHEDULED and job.attempt == 0 and job.errors == []
    assert engine.job_pass_get(job.id).admission_misses == 1  # type: ignore[union-attr]


def test_begin__clears_the_misses_of_a_run(engine: BaseEngine, client_id: int) -> None:
    handle = paged.start(n=1, instance="clears")
    assert worker_pass(engine, client_id, "pl", now=engine.now() - 50 * SECOND) == "missed"

    assert worker_pass(engine, client_id, "pl", now=engine.now() + HOUR) == "done"

    assert SEEN[-1].admission_misses == 0
    assert handle.refresh().state == JobState.COMPLETED


# -- the step's retry budget ----------------------------------------------------------


def test_step__a_step_out_of_its_budget_fails_the_run_with_attempts_left(
    engine: BaseEngine, client_id: int
) -> None:
    handle = flaky.start(budget=2, instance="budget")

    assert worker_pass(engine, client_id, "pl-budget") == "failed"
    assert handle.refresh().state == JobState.RETRYABLE
    outcome = worker_pass(engine, client_id, "pl-budget", now=engine.now() + HOUR)

    assert outcome == "discarded"
    job = handle.refresh()
    assert job.state == JobState.DISCARDED and job.attempt == 2 < job.max_attempts
    assert "step 'boom' failed 2 times, its retry budget (max_attempts=2)" in job.errors[-1].error
    assert "upstream down" in job.errors[-1].error
    assert CALLS == ["ok", "boom", "boom"]  # the memoized step never ran again
    (row,) = [s for s in engine.job_steps(job.id) if s.step == "boom"]
    assert row.attempts == 2 and not row.done


def test_step__may_narrow_the_job_retry_policy_never_widen_it(
    engine: BaseEngine, client_id: int
) -> None:
    handle = flaky.start(budget=6, instance="wide")

    assert worker_pass(engine, client_id, "pl-budget") == "failed"

    error = handle.refresh().errors[-1].error
    assert "max_attempts" in error and "never widen it" in error
    assert CALLS == ["ok"]


def test_step__the_budget_is_the_job_max_attempts_by_default(
    engine: BaseEngine, client_id: int
) -> None:
    handle = flaky.start(budget=None, instance="default-budget")
    now = engine.now()
    for _ in range(4):
        assert worker_pass(engine, client_id, "pl-budget", now=now) == "failed"
        now += HOUR
    assert worker_pass(engine, client_id, "pl-budget", now=now) == "discarded"
    assert "max_attempts=5" in handle.refresh().errors[-1].error


def test_step_exhausted__is_a_discard_of_the_run() -> None:
    from django_hopper.context import JobDiscard

    assert issubclass(StepExhausted, JobDiscard)


# -- the default instance -----------------------------------------------------------------


def test_start__without_an_instance_runs_the_default_one_and_joins_it(engine: BaseEngine) -> None:
    first = single.start()
    second = single.start()

    assert second.duplicate and second.id == first.id
    assert first.refresh().unique_key == f"{single.kind}:{DEFAULT_INSTANCE}"
    assert not single.start(instance="other").duplicate


# -- drive(): the takeover, and the bounded driver -------------------------------------------


def test_drive__takes_over_a_run_whose_pass_lease_expired_and_reports_a_miss_as_missed(
    engine: BaseEngine, client_id: int
) -> None:
    handle = paged.start(n=1, instance="drive-takeover")
    (job,) = engine.job_claim(JobClaimParams(queue="pl", client_id=client_id, limit=1)).jobs
    from django_hopper.runs import begin_pass

    begin_pass(engine, JobContext(job, engine), paged.lease)
    engine.job_pass_takeover_many(
        JobPassTakeoverParams(kinds=(), limit=10, max_misses=10, now=engine.now() + HOUR)
    )

    assert paged.drive(handle.id) == "done"
    assert [e.rescue for e in handle.refresh().errors] == [RescueReason.LEASE_EXPIRED]


def test_drive__a_pass_that_raises_job_canceled_ends_the_run_canceled_as_a_worker_does(
    engine: BaseEngine,
) -> None:
    handle = cancels.start(instance="drive-cancel")

    report = drive_due(kinds=cancels.kind)

    assert (report.driven, report.canceled, report.failed) == (1, 1, 0)
    job = handle.refresh()
    assert job.state == JobState.CANCELED
    assert [e.rescue for e in job.errors] == [RescueReason.CANCELED]


def test_drive_due__drives_due_runs_up_to_the_limit_and_reports(engine: BaseEngine) -> None:
    handles = [paged.start(n=1, instance=f"due-{i}") for i in range(3)]
    later = paged.using(run_after=HOUR).start(n=1, instance="later")

    report = drive_due(limit=2, kinds=(paged.kind,))

    assert (report.driven, report.finished, report.missed, report.failed) == (2, 2, 0, 0)
    assert report.stopped == "limit"
    states = [h.refresh().state for h in handles]
    assert states.count(JobState.COMPLETED) == 2
    assert later.refresh().state == JobState.SCHEDULED

    rest = drive_due(limit=10, kinds=(paged.kind,))
    assert (rest.driven, rest.finished, rest.stopped) == (1, 1, "done")


def test_drive_due__reports_a_claim_that_did_not_begin_as_a_miss_with_a_warning(
    engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_hopper import runs

    monkeypatch.setattr(runs, "pass_margin", lambda lease: lease - dt.timedelta(microseconds=1))
    handle = single.start(instance="drive-miss")

    report = drive_due(limit=10, kinds=(single.kind,))

    assert (report.driven, report.missed, report.failed) == (0, 1, 0)
    ((run_id, warning),) = report.warnings
    assert run_id == handle.id and "admission miss 1/10" in warning
    assert handle.refresh().attempt == 0


def test_drive_due__stops_at_its_deadline_and_reports_failures_without_stopping(
    engine: BaseEngine,
) -> None:
    failing = flaky.start(budget=1, instance="drive-fails")
    ok = single.start(instance="drive-ok")

    report = drive_due(limit=10, kinds=(flaky.kind, single.kind))

    assert (report.driven, report.finished, report.failed) == (2, 1, 1)
    assert report.errors and report.errors[0][0] == failing.id
    assert "retry budget" in report.errors[0][1]
    assert ok.refresh().state == JobState.COMPLETED
    assert report.as_dict()["errors"][0]["run"] == str(failing.id)

    single.start(instance="drive-late")
    ticks = iter(range(0, 1000, 10))  # each read of the clock: 10 s later
    stopped = drive_due(
        limit=10, deadline=5, kinds=(single.kind,), monotonic=lambda: float(next(ticks))
    )
    assert (stopped.driven, stopped.stopped) == (0, "deadline")


def test_drive_due__takes_one_kind_as_a_string(engine: BaseEngine) -> None:
    handle = single.start(instance="drive-one-kind")

    report = drive_due(kinds=single.kind)  # one kind, not its characters

    assert (report.driven, report.finished) == (1, 1)
    assert handle.refresh().state == JobState.COMPLETED


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"deadline": -1}, "deadline"),
        ({"kinds": [""]}, "kinds"),
        ({"kinds": [3]}, "kinds"),
    ],
)
def test_drive_due__refuses_a_bad_limit_or_deadline(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJob) as info:
        drive_due(**kwargs)
    assert info.value.field == field


# -- from cron: the commands ------------------------------------------------------------


def test_hopper_drive__drives_due_runs_and_prints_the_report(engine: BaseEngine) -> None:
    import io
    import json

    from django.core.management import call_command

    handle = paged.start(n=1, instance="command")
    out = io.StringIO()

    call_command("hopper_drive", "--limit", "5", "--kind", paged.kind, "--json", stdout=out)

    report = json.loads(out.getvalue())
    assert (report["driven"], report["finished"], report["missed"], report["failed"]) == (
        1,
        1,
        0,
        0,
    )
    assert handle.refresh().state == JobState.COMPLETED


def test_hopper_drive__exits_non_zero_on_a_failed_pass_when_asked(engine: BaseEngine) -> None:
    import io

    from django.core.management import CommandError, call_command

    flaky.start(budget=1, instance="command-fails")
    out = io.StringIO()

    with pytest.raises(CommandError) as info:
        call_command(
            "hopper_drive", "--kind", flaky.kind, "--fail-on-error", stdout=out, stderr=out
        )

    assert info.value.returncode == 4
    assert "retry budget" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_hopper_maintain_once__drives_due_runs_after_its_services(tx_engine: BaseEngine) -> None:
    import io

    from django.core.management import call_command

    handle = single.start(instance="maintain")
    out = io.StringIO()

    call_command("hopper_maintain", "--once", "--drive-runs", "10", stdout=out)

    assert handle.refresh().state == JobState.COMPLETED
    assert '"finished": 1' in out.getvalue()


# -- through an in-process worker --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_worker__fences_a_pass_result_to_its_pass_lease(
    tx_engine: BaseEngine, make_worker: Any
) -> None:
    handle = paged.start(n=2, instance="worker")
    worker = make_worker(queues={"pl": 1})

    assert worker.run_once() == 1
    assert handle.refresh().state == JobState.SCHEDULED  # committed, the next pass due
    assert worker.run_once() == 1

    done = handle.refresh()
    assert done.state == JobState.COMPLETED and done.errors == []
    assert all(s.began_at is not None for s in SEEN) and len(SEEN) == 2


@pytest.mark.django_db(transaction=True)
def test_worker__a_pass_that_cannot_begin_writes_no_result_and_frees_its_slot(
    tx_engine: BaseEngine, make_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_hopper import runs, signals

    # A margin of the whole lease but a microsecond: no claim can BEGIN.
    monkeypatch.setattr(runs, "pass_margin", lambda lease: lease - dt.timedelta(microseconds=1))
    ended: list[str] = []

    def on_finished(sender: Any, job: Any, state: str, **kwargs: Any) -> None:
        ended.append(state)

    signals.job_finished.connect(on_finished, dispatch_uid="tests.pass_leases.finished")
    try:
        handle = paged.start(n=1, instance="worker-miss")
        worker = make_worker(queues={"pl": 1})
        assert worker.run_once() == 1
    finally:
        signals.job_finished.disconnect(dispatch_uid="tests.pass_leases.finished")

    job = handle.refresh()
    assert job.state == JobState.SCHEDULED and job.attempt == 0 and job.errors == []
    assert tx_engine.job_pass_get(job.id).admission_misses == 1  # type: ignore[union-attr]
    assert ended == [JobState.SCHEDULED] and SEEN == []
    assert worker.running() == 0
