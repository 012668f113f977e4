"""job_finalize_many: fences, history, retries, snoozes, errors, logs, cancel wins."""

from __future__ import annotations

import datetime as dt

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobCancelParams, JobFinalize, JobFinalized
from django_hopper.ids import new_id
from django_hopper.types import AttemptError, AttemptLog
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim_one,
    finalize,
    get,
    insert,
    list_ids,
    live_ids,
    result,
    running,
)
from tests.factories import JobFactory

# -- to history ------------------------------------------------------------------


@pytest.mark.parametrize("state", ["completed", "canceled", "discarded"])
def test_finalize__final_state_moves_the_job_to_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = running(engine, client_id, db_now, kind="tests.f")
    at = db_now + SECOND

    applied = finalize(engine, at, result(job, state, output={"answer": 42}))

    assert applied == [JobFinalized(id=job.id, fence=1)]
    stored = get(engine, job)
    assert stored.state == state
    assert stored.finalized_at == at
    assert stored.output == {"answer": 42}
    assert stored.is_live is False
    assert stored.fence == 1
    assert stored.attempt == 1
    assert live_ids(engine, kinds=("tests.f",)) == []
    assert list_ids(engine, kinds=("tests.f",), states=(state,)) == [job.id]


def test_finalize__completed_without_archive_deletes_the_job_and_its_logs(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    applied = finalize(engine, db_now, result(job, "completed", archive=False, log="done\n"))

    assert applied == [JobFinalized(id=job.id, fence=1)]
    assert engine.job_get(job.id) is None
    assert engine.job_logs(job.id) == []


@pytest.mark.parametrize("state", ["canceled", "discarded"])
def test_finalize__canceled_and_discarded_are_archived_even_without_archive(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    job = running(engine, client_id, db_now)

    finalize(engine, db_now, result(job, state, archive=False))

    assert get(engine, job).state == state


# -- fences --------------------------------------------------------------------------


def test_finalize__refuses_a_result_from_a_stale_fence(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(first, "retryable"))
    second = claim_one(engine, client_id, db_now + SECOND)

    applied = finalize(engine, db_now + SECOND, result(first, "completed"))

    assert applied == []
    stored = get(engine, second)
    assert stored.state == "running"
    assert stored.fence == 2


def test_finalize__refuses_a_result_from_another_client(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    forged = JobFinalize(
        id=job.id, attempted_by=other_client_id, fence=job.fence, state="completed"
    )

    assert finalize(engine, db_now, forged) == []
    assert get(engine, job).state == "running"


def test_finalize__refuses_a_result_for_a_job_no_longer_running(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "completed", output={"n": 1}))

    assert finalize(engine, db_now + SECOND, result(job, "discarded")) == []
    stored = get(engine, job)
    assert stored.state == "completed"
    assert stored.output == {"n": 1}


def test_finalize__refuses_a_result_for_an_unknown_job(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    ghost = JobFinalize(id=new_id(), attempted_by=client_id, fence=1, state="completed")

    assert finalize(engine, db_now, ghost) == []


def test_finalize__of_two_results_of_one_job_only_the_current_fence_applies(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(first, "retryable"))
    second = claim_one(engine, client_id, db_now)

    applied = finalize(
        engine,
        db_now,
        result(first, "discarded", output="stale"),
        result(second, "completed", output="current"),
    )

    assert applied == [JobFinalized(id=second.id, fence=2)]
    stored = get(engine, second)
    assert stored.state == "completed"
    assert stored.output == "current"


def test_finalize__of_two_results_of_one_claim_at_most_one_applies(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    applied = finalize(
        engine,
        db_now,
        result(job, "completed", output="a"),
        result(job, "retryable", delay=MINUTE),
    )

    assert len(applied) <= 1
    stored = get(engine, job)
    if applied:
        assert applied == [JobFinalized(id=job.id, fence=1)]
        assert stored.state in ("completed", "retryable")
    else:
        assert stored.state == "running"


def test_finalize__applies_a_batch_and_returns_only_the_applied_results(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    a = running(engine, client_id, db_now)
    b = running(engine, client_id, db_now)
    c = running(engine, client_id, db_now)

    applied = finalize(
        engine,
        db_now,
        result(a, "completed"),
        JobFinalize(id=b.id, attempted_by=other_client_id, fence=b.fence, state="completed"),
        result(c, "retryable", delay=MINUTE),
    )

    assert sorted(applied, key=lambda f: f.id) == sorted(
        [JobFinalized(id=a.id, fence=1), JobFinalized(id=c.id, fence=1)], key=lambda f: f.id
    )
    assert get(engine, a).state == "completed"
    assert get(engine, b).state == "running"
    assert get(engine, c).state == "retryable"


def test_finalize__a_large_batch_applies_each_result_and_refuses_the_fenced_ones(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    # Larger than the batches the PostgreSQL engine runs as a prepared statement.
    jobs = [running(engine, client_id, db_now, kind="tests.large") for _ in range(40)]
    refused = jobs[::7]
    results = [
        JobFinalize(id=j.id, attempted_by=other_client_id, fence=j.fence, state="completed")
        if j in refused
        else result(j, "completed", output=i)
        for i, j in enumerate(jobs)
    ]

    applied = finalize(engine, db_now, *results, no_batches=True)

    kept = [j for j in jobs if j not in refused]
    assert sorted(a.id for a in applied) == sorted(j.id for j in kept)
    assert [get(engine, j).output for j in kept] == [i for i, j in enumerate(jobs) if j in kept]
    assert {get(engine, j).state for j in refused} == {"running"}


def test_finalize__a_batch_of_final_results_sharing_client_and_state_is_fenced_per_result(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    jobs = [running(engine, client_id, db_now, kind="tests.same") for _ in range(5)]
    stale, kept = jobs[1], [j for j in jobs if j is not jobs[1]]
    results = [
        JobFinalize(
            id=j.id, attempted_by=client_id, fence=j.fence + (j is stale), state="completed"
        )
        for j in jobs
    ]

    applied = finalize(engine, db_now, *results)

    assert sorted(a.id for a in applied) == sorted(j.id for j in kept)
    assert {get(engine, j).state for j in kept} == {"completed"}
    assert get(engine, stale).state == "running"


def test_finalize__a_batch_of_final_results_mixing_clients_states_and_archive_applies_each_as_given(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    kept, dropped, canceled, forged, other = (
        running(engine, client_id, db_now, kind="tests.mixed") for _ in range(5)
    )

    applied = finalize(
        engine,
        db_now,
        result(kept, "completed"),
        result(dropped, "completed", archive=False),
        result(canceled, "canceled", archive=False),
        JobFinalize(id=forged.id, attempted_by=other_client_id, fence=1, state="completed"),
        result(other, "discarded"),
    )

    assert sorted(a.id for a in applied) == sorted(j.id for j in (kept, dropped, canceled, other))
    assert get(engine, kept).state == "completed"
    assert engine.job_get(dropped.id) is None
    assert get(engine, canceled).state == "canceled"
    assert get(engine, forged).state == "running"
    assert get(engine, other).state == "discarded"


def test_finalize__empty_batch_applies_nothing(engine: BaseEngine, db_now: dt.datetime) -> None:
    assert finalize(engine, db_now) == []


def test_finalize__no_batches_flag_applies_results_the_same_way(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    applied = finalize(engine, db_now, result(job, "completed"), no_batches=True)

    assert applied == [JobFinalized(id=job.id, fence=1)]
    assert get(engine, job).state == "completed"


#: Outputs the common batch must store as given, next to results without one.
AWKWARD_OUTPUTS = [
    None,
    "NULL",
    "",
    'say "hi", {then} \\ leave',
    {"path": "C:\\temp", "quote": '"', "braces": "{a,b}", "snow": "☃"},
    [None, "null", 1.5],
    0,
]


def test_finalize__the_common_batch_stores_each_output_as_given(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    # Every result completed and archived, none in a batch: the engine's common path.
    jobs = [running(engine, client_id, db_now) for _ in AWKWARD_OUTPUTS]
    fenced = running(engine, client_id, db_now)

    applied = finalize(
        engine,
        db_now,
        *[result(j, "completed", output=o) for j, o in zip(jobs, AWKWARD_OUTPUTS, strict=True)],
        JobFinalize(
            id=fenced.id, attempted_by=client_id + 1, fence=1, state="completed", output="x"
        ),
        no_batches=True,
    )

    assert sorted(applied, key=lambda a: a.id) == sorted(
        (JobFinalized(id=j.id, fence=1) for j in jobs), key=lambda a: a.id
    )
    assert [get(engine, j).output for j in jobs] == AWKWARD_OUTPUTS
    assert [get(engine, j).state for j in jobs] == ["completed"] * len(jobs)
    assert get(engine, fenced).state == "running"


# -- job leases (claimed by ID: no client) -------------------------------------------


def test_finalize__a_leased_job_accepts_the_result_of_its_lease_token(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = JobFactory(now=db_now, leased=True)
    res = JobFinalize(
        id=job.id, attempted_by=None, fence=1, state="completed", lease_token=job.lease_token
    )

    assert finalize(engine, db_now, res) == [JobFinalized(id=job.id, fence=1)]
    assert get(engine, job.id).state == "completed"


def test_finalize__a_leased_job_refuses_another_token(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = JobFactory(now=db_now, leased=True)
    wrong_token = JobFinalize(
        id=job.id, attempted_by=None, fence=1, state="completed", lease_token=new_id()
    )
    by_client = JobFinalize(id=job.id, attempted_by=client_id, fence=1, state="completed")

    assert finalize(engine, db_now, wrong_token) == []
    assert finalize(engine, db_now, by_client) == []
    assert get(engine, job.id).state == "running"


# -- staying live: retry and snooze ------------------------------------------------


def test_finalize__retryable_waits_out_its_delay_and_keeps_the_claim_details(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    at = db_now + SECOND

    applied = finalize(engine, at, result(job, "retryable", delay=30 * SECOND))

    assert applied == [JobFinalized(id=job.id, fence=1)]
    stored = get(engine, job)
    assert stored.state == "retryable"
    assert stored.scheduled_at == at + 30 * SECOND
    assert stored.attempt == 1
    assert stored.fence == 1
    assert stored.attempted_by == client_id
    assert stored.attempted_at == db_now
    assert stored.finalized_at is None
    assert stored.snooze_reason is None


def test_finalize__retryable_without_delay_is_due_at_once(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    finalize(engine, db_now, result(job, "retryable"))

    assert get(engine, job).scheduled_at == db_now


def test_finalize__snooze_gives_the_attempt_back_and_keeps_the_reason_while_scheduled(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    finalize(
        engine,
        db_now,
        result(job, "scheduled", delay=HOUR, snooze=True, snooze_reason="rate limited"),
    )

    stored = get(engine, job)
    assert stored.state == "scheduled"
    assert stored.attempt == 0
    assert stored.fence == 1
    assert stored.scheduled_at == db_now + HOUR
    assert stored.snooze_reason == "rate limited"


def test_finalize__scheduled_without_snooze_keeps_the_attempt(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    finalize(engine, db_now, result(job, "scheduled", delay=HOUR))

    stored = get(engine, job)
    assert stored.state == "scheduled"
    assert stored.attempt == 1
    assert stored.snooze_reason is None


def test_finalize__a_retryable_result_never_keeps_a_snooze_reason(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    finalize(engine, db_now, result(job, "retryable", snooze=True, snooze_reason="ignored"))

    stored = get(engine, job)
    assert stored.state == "retryable"
    assert stored.attempt == 0
    assert stored.snooze_reason is None


def test_finalize__the_snooze_reason_is_dropped_when_the_job_fails_later(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(first, "scheduled", snooze=True, snooze_reason="wait"))
    second = claim_one(engine, client_id, db_now + SECOND)

    finalize(engine, db_now + SECOND, result(second, "retryable", delay=MINUTE))

    assert get(engine, second).snooze_reason is None


@pytest.mark.parametrize("state", ["completed", "discarded"])
def test_finalize__history_never_reports_a_snooze_reason(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, state: str
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(first, "scheduled", snooze=True, snooze_reason="wait"))
    second = claim_one(engine, client_id, db_now)

    finalize(engine, db_now, result(second, state))

    assert get(engine, second).snooze_reason is None


# -- errors ----------------------------------------------------------------------------


def test_finalize__appends_errors_stamped_with_database_time(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now, max_attempts=3)
    t1, t2, t3 = db_now + SECOND, db_now + 2 * SECOND, db_now + 3 * SECOND
    first = claim_one(engine, client_id, db_now)
    finalize(
        engine,
        t1,
        result(
            first,
            "retryable",
            error=AttemptError(at=None, attempt=1, error="first", fence=1, trace="tb1"),
        ),
    )
    second = claim_one(engine, client_id, t1)
    finalize(
        engine, t2, result(second, "retryable", error=AttemptError(None, 2, "second", fence=2))
    )
    third = claim_one(engine, client_id, t2)
    finalize(engine, t3, result(third, "discarded", error=AttemptError(None, 3, "third", fence=3)))

    errors = get(engine, third).errors
    assert [(e.attempt, e.fence, e.error, e.at) for e in errors] == [
        (1, 1, "first", t1),
        (2, 2, "second", t2),
        (3, 3, "third", t3),
    ]
    assert errors[0].trace == "tb1"
    assert errors[1].trace == ""


def test_finalize__the_engine_sets_the_error_time_even_when_given_one(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    stale = db_now - HOUR

    finalize(engine, db_now, result(job, "retryable", error=AttemptError(stale, 1, "x", fence=1)))

    (error,) = get(engine, job).errors
    assert error.at == db_now


def test_finalize__a_fenced_result_records_no_error(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, other_client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    forged = JobFinalize(
        id=job.id,
        attempted_by=other_client_id,
        fence=job.fence,
        state="retryable",
        error=AttemptError(None, 1, "not mine"),
        log="not mine\n",
    )

    finalize(engine, db_now, forged)

    assert get(engine, job).errors == []
    assert engine.job_logs(job.id) == []


# -- cancel wins ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "outcome",
    [
        {"state": "retryable", "delay": MINUTE},
        {"state": "scheduled", "delay": MINUTE, "snooze": True, "snooze_reason": "later"},
    ],
    ids=["retryable", "snooze"],
)
def test_finalize__a_requested_cancel_wins_over_a_retry_or_snooze(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, outcome: dict[str, object]
) -> None:
    job = running(engine, client_id, db_now)
    engine.job_cancel(JobCancelParams(id=job.id, now=db_now))

    applied = finalize(engine, db_now + SECOND, result(job, **outcome))  # type: ignore[arg-type]

    assert applied == [JobFinalized(id=job.id, fence=1)]
    stored = get(engine, job)
    assert stored.state == "canceled"
    assert stored.finalized_at == db_now + SECOND
    assert stored.snooze_reason is None


def test_finalize__a_requested_cancel_does_not_undo_a_completion(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)
    engine.job_cancel(JobCancelParams(id=job.id, now=db_now))

    finalize(engine, db_now, result(job, "completed", output="done"))

    stored = get(engine, job)
    assert stored.state == "completed"
    assert stored.output == "done"


# -- attempt logs ------------------------------------------------------------------------


def test_finalize__records_each_attempt_log_with_its_attempt_number(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    first = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(first, "retryable", log="one\n"))
    second = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(second, "completed", log="two\n"))

    assert engine.job_logs(first.id) == [
        AttemptLog(attempt=1, log="one\n", snoozed=False),
        AttemptLog(attempt=2, log="two\n", snoozed=False),
    ]


def test_finalize__a_snooze_log_replaces_the_earlier_snooze_log_of_the_same_attempt(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    job = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "scheduled", snooze=True, log="snooze 1\n"))
    assert engine.job_logs(job.id) == [AttemptLog(attempt=1, log="snooze 1\n", snoozed=True)]

    job = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "scheduled", snooze=True, log="snooze 2\n"))
    assert engine.job_logs(job.id) == [AttemptLog(attempt=1, log="snooze 2\n", snoozed=True)]

    job = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "retryable", log="failed\n"))
    job = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "scheduled", snooze=True, log="snooze 3\n"))

    assert engine.job_logs(job.id) == [
        AttemptLog(attempt=1, log="snooze 2\n", snoozed=True),
        AttemptLog(attempt=1, log="failed\n", snoozed=False),
        AttemptLog(attempt=2, log="snooze 3\n", snoozed=True),
    ]


def test_finalize__a_snooze_without_a_log_drops_the_earlier_snooze_log(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    job = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "scheduled", snooze=True, log="snooze 1\n"))
    job = claim_one(engine, client_id, db_now)
    finalize(engine, db_now, result(job, "scheduled", snooze=True))

    assert engine.job_logs(job.id) == []


def test_finalize__keep_logs_keeps_only_the_newest_logs(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    for n in range(1, 4):
        job = claim_one(engine, client_id, db_now)
        finalize(engine, db_now, result(job, "retryable", log=f"attempt {n}\n"), keep_logs=2)

    assert engine.job_logs(job.id) == [
        AttemptLog(attempt=2, log="attempt 2\n"),
        AttemptLog(attempt=3, log="attempt 3\n"),
    ]


def test_finalize__keep_logs_zero_keeps_every_log(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    insert(engine, db_now)
    for n in range(1, 5):
        job = claim_one(engine, client_id, db_now)
        finalize(engine, db_now, result(job, "retryable", log=f"attempt {n}\n"), keep_logs=0)

    assert [log.attempt for log in engine.job_logs(job.id)] == [1, 2, 3, 4]


def test_finalize__logs_stay_readable_once_the_job_is_in_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    finalize(engine, db_now, result(job, "discarded", log="gave up\n"))

    assert get(engine, job).state == "discarded"
    assert engine.job_logs(job.id) == [AttemptLog(attempt=1, log="gave up\n")]


def test_finalize__no_log_given_records_no_log(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    job = running(engine, client_id, db_now)

    finalize(engine, db_now, result(job, "completed"))

    assert engine.job_logs(job.id) == []
