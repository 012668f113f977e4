"""How an attempt ends, run through an in-process worker with ``run_once()``."""

from __future__ import annotations

import datetime as dt
import gc
import random

import pytest
from django.test import override_settings

from django_hopper.context import JobContext
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalizeParams,
    JobRetryParams,
)
from django_hopper.exceptions import InvalidJob, JobFenced, JobLocked
from django_hopper.retry import backoff
from django_hopper.worker.execution import Execution
from tests.engine_conformance.test_concurrency import row_held
from tests.support.runtime import get, insert, insert_kind, wait_for
from tests.testapp import jobs
from tests.testapp.models import Effect


def make_due(engine, job) -> None:
    """Bring a waiting job's schedule forward (as an operator's retry does)."""
    engine.job_retry(JobRetryParams(id=job.id))


def test_a_returned_value_completes_the_job_with_it_as_output(tx_engine, make_worker):
    job = insert(tx_engine, jobs.add, 2, 3)
    worker = make_worker()
    assert worker.run_once() == 1
    row = get(tx_engine, job)
    assert row.state == "completed"
    assert row.output == 5
    assert row.attempt == 1


def test_an_exception_makes_the_job_retryable_after_backoff_with_the_traceback(
    tx_engine, make_worker
):
    job = insert(tx_engine, jobs.rt_flaky, failures=1)
    before = tx_engine.now()
    make_worker().run_once()
    row = get(tx_engine, job)
    assert row.state == "retryable"
    assert len(row.errors) == 1
    error = row.errors[0]
    assert error.error == "ValueError: flaky failure 1"
    assert "Traceback" in error.trace and "rt_flaky" in error.trace
    assert error.attempt == 1 and error.fence == row.fence
    # Default rule: 1 * 1**4 seconds with ±10% jitter.
    wait = (row.scheduled_at - before).total_seconds()
    assert 0.85 <= wait <= 1.5, wait


def test_a_retried_job_completes_and_keeps_each_attempts_log(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_flaky, failures=1)
    worker = make_worker()
    worker.run_once()
    make_due(tx_engine, job)
    assert worker.run_once() == 1
    row = get(tx_engine, job)
    assert row.state == "completed" and row.attempt == 2 and row.output == "ok"
    logs = tx_engine.job_logs(job.id)
    assert [(log.attempt, log.log) for log in logs] == [(1, "attempt 1\n"), (2, "attempt 2\n")]


def test_a_job_out_of_attempts_is_discarded(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_flaky, failures=10)  # max_attempts=3
    worker = make_worker()
    for _ in range(3):
        assert worker.run_once() == 1
        if get(tx_engine, job).is_live:
            make_due(tx_engine, job)
    row = get(tx_engine, job)
    assert row.state == "discarded"
    assert [e.attempt for e in row.errors] == [1, 2, 3]


def test_a_snooze_reschedules_the_job_and_gives_the_attempt_back(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_snooze_once, delay=60)
    worker = make_worker()
    worker.run_once()
    row = get(tx_engine, job)
    assert row.state == "scheduled"
    assert row.attempt == 0
    assert row.snooze_reason == "waiting for something"
    assert row.errors == []
    assert (row.scheduled_at - tx_engine.now()).total_seconds() > 50
    make_due(tx_engine, job)
    worker.run_once()
    row = get(tx_engine, job)
    assert row.state == "completed" and row.output == "woke" and row.attempt == 1
    assert [log.snoozed for log in tx_engine.job_logs(job.id)] == [True]


def test_a_value_that_is_not_json_fails_the_attempt_with_a_clear_error(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_not_json)
    make_worker().run_once()
    row = get(tx_engine, job)
    assert row.state == "retryable"
    assert "not JSON" in row.errors[0].error and "set" in row.errors[0].error


@pytest.mark.parametrize("nested", [False, True])
def test_a_value_with_a_nul_character_fails_the_attempt_alike_on_both_engines(
    tx_engine, make_worker, nested
):
    job = insert(tx_engine, jobs.rt_returns_nul, nested=nested)
    ok = insert(tx_engine, jobs.add, 1, 2)  # a healthy result in the same batch is written
    make_worker().run_once()
    row = get(tx_engine, job)
    assert row.state == "retryable"
    assert "NUL character" in row.errors[0].error
    healthy = tx_engine.job_get(ok.id)  # gone from the live table once completed (no archive)
    assert healthy is None or healthy.state == "completed"


def test_context_log_lines_are_stored_with_the_attempt(tx_engine, make_worker):
    job = insert(tx_engine, jobs.with_context, note="hello")
    make_worker().run_once()
    assert get(tx_engine, job).output == 1
    assert [log.log for log in tx_engine.job_logs(job.id)] == ["attempt 1: hello\n"]


def test_an_unknown_kind_is_snoozed_with_its_reason_and_keeps_its_attempt(tx_engine, make_worker):
    job = insert_kind(tx_engine, "tests.testapp.jobs.no_such_job")
    assert make_worker().run_once() == 1
    row = get(tx_engine, job)
    assert row.state == "scheduled"
    assert row.attempt == 0  # given back: the job ran nothing
    assert row.errors == []
    assert "unknown job kind 'tests.testapp.jobs.no_such_job'" in (row.snooze_reason or "")
    assert row.scheduled_at >= tx_engine.now()  # waits its backoff before the next try


def test_an_unknown_kind_runs_once_a_worker_of_the_new_release_knows_it(tx_engine, make_worker):
    from django_hopper.jobs import job as job_decorator
    from django_hopper.registry import registry

    kind = "tests.testapp.jobs.deployed_later"
    queued = insert_kind(tx_engine, kind)
    assert make_worker().run_once() == 1  # the previous release's worker
    assert get(tx_engine, queued).state == "scheduled"

    def deployed_later() -> str:
        return "ran"

    job_decorator(kind=kind)(deployed_later)  # the new release registers the kind
    try:
        make_due(tx_engine, queued)
        assert make_worker().run_once() == 1
    finally:
        registry.pop(kind, None)
    row = get(tx_engine, queued)
    assert (row.state, row.output, row.attempt) == ("completed", "ran", 1)


def test_an_unknown_kind_is_discarded_with_the_reason_once_older_than_the_grace(
    tx_engine, make_worker
):
    from django_hopper.models import Job

    job = insert_kind(tx_engine, "tests.testapp.jobs.no_such_job")
    Job.objects.filter(id=job.id).update(created_at=job.created_at - dt.timedelta(hours=1))
    assert make_worker().run_once() == 1
    row = get(tx_engine, job)
    assert row.state == "discarded"
    assert "unknown job kind" in row.errors[0].error
    assert "within 900s of enqueue" in row.errors[0].error
    assert row.attempt == 1 < row.max_attempts


def test_an_unknown_kind_without_a_grace_is_discarded_at_once(tx_engine, make_worker, settings):
    with override_settings(HOPPER={**settings.HOPPER, "UNKNOWN_KIND_GRACE": 0}):
        job = insert_kind(tx_engine, "tests.testapp.jobs.no_such_job")
        assert make_worker().run_once() == 1
    row = get(tx_engine, job)
    assert row.state == "discarded"
    assert "unknown job kind" in row.errors[0].error


def test_a_sync_job_past_its_timeout_fails_and_its_late_result_is_dropped(tx_engine, make_worker):
    from django_hopper.signals import job_finished

    seen = []

    def receive(sender, job, state, error, output, **kwargs):
        seen.append((state, type(error).__name__, output))

    job_finished.connect(receive, weak=False, dispatch_uid="timeout-test")
    try:
        job = insert(tx_engine, jobs.rt_sleep_sync, 1.0)
        worker = make_worker()
        worker.run_once()  # returns once the thread really ended, after its late result
    finally:
        job_finished.disconnect(dispatch_uid="timeout-test")
    row = get(tx_engine, job)
    assert row.state == "retryable"
    assert row.errors[0].error == "timed out after 0.3s"
    assert row.output is None
    # Announced once, as the timeout decided it; never as the dropped late result.
    assert seen == [("retryable", "TimeoutError", None)]


def test_an_async_job_past_its_timeout_is_cancelled_and_fails(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_sleep_async, 30)
    worker = make_worker()
    started = dt.datetime.now()
    worker.run_once()
    assert (dt.datetime.now() - started).total_seconds() < 5
    row = get(tx_engine, job)
    assert row.state == "retryable"
    assert row.errors[0].error == "timed out after 0.3s"


def test_an_async_job_runs_on_the_event_loop(tx_engine, make_worker):
    job = insert(tx_engine, jobs.async_add, 4, 5)
    make_worker().run_once()
    assert get(tx_engine, job).output == 9


def test_progress_is_recorded_through_the_context(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_progress, steps=3)
    make_worker().run_once()
    row = get(tx_engine, job)
    assert row.output == {"stored": [True, True, True], "step": "step-2"}
    assert row.progress is not None and row.progress.cursor == {"i": 2}


def test_progress_of_an_attempt_that_lost_its_job_is_refused(tx_engine):
    job = insert(tx_engine, jobs.noop)
    client = tx_engine.client_register(
        ClientRegisterParams(hostname="t", ttl=dt.timedelta(seconds=30))
    )
    (claimed,) = tx_engine.job_claim(
        JobClaimParams(queue="default", client_id=client, limit=1)
    ).jobs
    assert claimed.id == job.id
    context = JobContext(claimed, tx_engine)
    assert context.record_progress("one", 1) is True
    assert context.progress is not None and context.progress.step == "one"
    # Another party ends the attempt (as the rescue would).
    tx_engine.job_finalize_many(
        JobFinalizeParams(
            jobs=[
                JobFinalize(
                    id=claimed.id, attempted_by=client, fence=claimed.fence, state="retryable"
                )
            ]
        )
    )
    assert context.record_progress("two", 2) is False
    assert context.lost
    with pytest.raises(JobFenced):
        context.check_cancelled()
    assert context.progress.step == "one"


def test_progress_keep_step_moves_the_cursor_within_the_stored_step(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_progress_keep_step, 3)

    assert make_worker().run_once() == 1

    row = get(tx_engine, job)
    assert row.output == {"step": "load", "cursor": {"i": 3}}
    assert row.progress is not None and (row.progress.step, row.progress.cursor) == (
        "load",
        {"i": 3},
    )


def test_progress_takes_a_step_or_keep_step_and_no_wait_never_waits_for_the_row(tx_engine):
    job = insert(tx_engine, jobs.noop)
    client = tx_engine.client_register(
        ClientRegisterParams(hostname="t", ttl=dt.timedelta(seconds=30))
    )
    (claimed,) = tx_engine.job_claim(
        JobClaimParams(queue="default", client_id=client, limit=1)
    ).jobs
    context = JobContext(claimed, tx_engine)
    context.record_progress("one", 1)

    with pytest.raises(InvalidJob):
        context.record_progress(cursor=2)  # no step, no keep_step: would clear the step
    with pytest.raises(InvalidJob):
        context.record_progress("two", 2, keep_step=True)  # the step would be ignored
    with row_held(claimed), pytest.raises(JobLocked):
        context.record_progress(cursor=2, keep_step=True, no_wait=True)

    assert get(tx_engine, job).progress.cursor == 1
    assert context.record_progress(cursor=3, keep_step=True, no_wait=True) is True
    assert (context.progress.step, context.progress.cursor) == ("one", 3)


def test_complete_in_the_jobs_transaction_commits_the_completion_with_the_jobs_rows(
    tx_engine, make_worker
):
    job = insert(tx_engine, jobs.rt_complete_in_transaction)

    assert make_worker().run_once() == 1

    row = get(tx_engine, job)
    assert (row.state, row.output, row.attempt) == ("completed", {"done": 1}, 1)
    assert list(Effect.objects.values_list("fence", "note")) == [(row.fence, "in-tx")]
    assert [log.log for log in tx_engine.job_logs(job.id)] == ["before the transaction\n"]


def test_complete_in_a_rolled_back_transaction_completed_nothing(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_complete_in_transaction, roll_back=True)

    make_worker().run_once()

    row = get(tx_engine, job)
    assert (row.state, row.errors[-1].error) == (
        "retryable",
        "RuntimeError: roll back the first attempt",
    )
    assert not Effect.objects.exists()
    make_due(tx_engine, job)
    make_worker().run_once()
    row = get(tx_engine, job)
    assert (row.state, row.output) == ("completed", {"done": 2})
    assert list(Effect.objects.values_list("fence", flat=True)) == [row.fence]


def test_what_a_job_raises_after_completing_itself_changes_nothing(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_complete_in_transaction, raise_after=True)

    make_worker().run_once()

    row = get(tx_engine, job)
    assert (row.state, row.output, row.errors) == ("completed", {"done": 1}, [])


def test_complete_is_refused_outside_a_workers_attempt(tx_engine):
    job = insert(tx_engine, jobs.noop)
    client = tx_engine.client_register(
        ClientRegisterParams(hostname="t", ttl=dt.timedelta(seconds=30))
    )
    (claimed,) = tx_engine.job_claim(
        JobClaimParams(queue="default", client_id=client, limit=1)
    ).jobs

    with pytest.raises(InvalidJob):
        JobContext(claimed, tx_engine).complete(1)
    assert get(tx_engine, job).state == "running"


def test_job_started_and_finished_signals_are_sent(tx_engine, make_worker):
    from django_hopper import signals

    seen: list[tuple[str, object]] = []

    def started(sender, job, **kwargs):
        seen.append(("started", job.id))

    def finished(sender, job, state, error, output, **kwargs):
        seen.append((state, output))

    signals.job_started.connect(started)
    signals.job_finished.connect(finished)
    try:
        job = insert(tx_engine, jobs.add, 1, 1)
        make_worker().run_once()
    finally:
        signals.job_started.disconnect(started)
        signals.job_finished.disconnect(finished)
    assert seen == [("started", job.id), ("completed", 2)]


def test_effects_are_written_from_the_job_thread(tx_engine, make_worker):
    job = insert(tx_engine, jobs.rt_effect)
    make_worker().run_once()
    row = get(tx_engine, job)
    assert list(Effect.objects.filter(job_id=job.id).values_list("fence", flat=True)) == [row.fence]


# ---------------------------------------------------------------------------
# The backoff rule


@override_settings(
    HOPPER={"BACKOFF_BASE": 2.0, "BACKOFF_EXPONENT": 2.0, "BACKOFF_MAX": 100, "BACKOFF_JITTER": 0}
)
def test_backoff_is_base_times_attempt_to_the_exponent_capped():
    assert [backoff(n).total_seconds() for n in (1, 2, 3, 7, 8, 50)] == [2, 8, 18, 98, 100, 100]


@override_settings(HOPPER={"BACKOFF_BASE": 10.0, "BACKOFF_EXPONENT": 1.0, "BACKOFF_JITTER": 0.2})
def test_backoff_jitter_stays_within_its_fraction():
    rng = random.Random(7)
    values = [backoff(1, rng=rng).total_seconds() for _ in range(200)]
    assert min(values) >= 8.0 and max(values) <= 12.0
    assert max(values) - min(values) > 2.0  # it does spread


def test_a_timed_out_attempt_holding_its_own_row_does_not_hold_up_other_results(
    tx_engine, make_worker
):
    if tx_engine.features.single_writer:
        pytest.skip("single-writer engines: an open write transaction holds every write")
    jobs.HOLD_OWN_ROW.clear()
    jobs.OWN_ROW_HELD.clear()
    held = insert(tx_engine, jobs.rt_hold_own_row)
    worker = make_worker(queues={"default": 2})
    producer = worker.producers["default"]
    try:
        assert producer.claim_once() == 1
        assert jobs.OWN_ROW_HELD.wait(10)
        execution = worker.executions[held.id.int]
        wait_for(lambda: (worker.check_deadlines(), execution.settled)[1])
        # The timeout's result waits for the row the attempt's own transaction holds;
        # a later attempt's result must not wait behind it.
        other = insert(tx_engine, jobs.add, 2, 3)
        assert producer.claim_once() == 1
        wait_for(lambda: get(tx_engine, other).state == "completed")
        assert get(tx_engine, held).state == "running"
    finally:
        jobs.HOLD_OWN_ROW.set()
    # Once the attempt's transaction ended, the timeout's result applies.
    assert worker.wait_idle(30)
    row = get(tx_engine, held)
    assert row.state == "retryable" and row.errors[0].error == "timed out after 0.3s"
    assert (row.progress.step, row.progress.cursor) == ("held", 1)


def test_an_ended_attempt_leaves_no_reference_cycle_behind(tx_engine, make_worker):
    # The cyclic collector's full collections stop every thread of a worker:
    # an attempt's objects are freed by their reference counts when it ends.
    for n in range(3):
        insert(tx_engine, jobs.add, n, 1)
    worker = make_worker(queues={"default": 1})  # one job thread, the attempts in turn
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert sum(worker.run_once() for _ in range(3)) == 3
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, (Execution, JobContext))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []


def test_complete_after_the_attempt_ended_is_fenced_and_writes_nothing(
    tx_engine, make_worker, monkeypatch
):
    # A thread the job left running calls complete() once the attempt is over.
    from django_hopper.worker.worker import Worker

    contexts: list[JobContext] = []
    on_done = Worker._on_done

    def keep_context(self, ex, result):
        contexts.append(ex.context)
        on_done(self, ex, result)

    monkeypatch.setattr(Worker, "_on_done", keep_context)
    job = insert(tx_engine, jobs.add, 2, 3)
    worker = make_worker(queues={"default": 1})
    assert worker.run_once() == 1

    with pytest.raises(JobFenced):
        contexts[0].complete("late")
    row = get(tx_engine, job)
    assert (row.state, row.output) == ("completed", 5)
