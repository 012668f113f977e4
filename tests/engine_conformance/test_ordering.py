"""Ordering keys: one job of a key at a time, oldest first, whatever its attempts do."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobClaimParams, JobInsertParams, JobRetryOrderingKeyParams
from django_hopper.models import Job
from django_hopper.types import WAKE_MARKER, JobRow, QueueLimits
from tests.engine_conformance.support import (
    HOUR,
    MINUTE,
    SECOND,
    claim,
    finalize,
    get,
    insert,
    insert_many,
    result,
)

Q = "lanes"


def keyed(engine: BaseEngine, now: dt.datetime, key: str, n: int = 1, **fields: Any) -> list:
    """Insert ``n`` jobs of one key, in ID order, and return them."""
    params = [JobInsertParams(kind="tests.job", queue=Q, ordering_key=key, **fields)] * n
    return [r.job for r in insert_many(engine, params, now)]


def wake(engine: BaseEngine, now: dt.datetime, key: str, limit: int = 100) -> int:
    return engine.job_retry_ordering_key(
        JobRetryOrderingKeyParams(queue=Q, ordering_key=key, limit=limit, now=now)
    )


def test_ordering__only_the_oldest_job_of_a_key_is_claimed(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    a1, a2, _a3 = keyed(engine, db_now, "a", 3)
    (b1,) = keyed(engine, db_now, "b")
    plain = insert(engine, db_now, queue=Q)

    got = claim(engine, client_id, db_now, queue=Q, limit=10)

    assert {j.id for j in got} == {a1.id, b1.id, plain.id}
    assert claim(engine, client_id, db_now, queue=Q, limit=10) == []
    assert get(engine, a2).state == "available"


def test_ordering__the_next_job_runs_once_the_head_finishes_in_id_order(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    jobs = keyed(engine, db_now, "a", 4)
    ran = []
    for _ in jobs:
        (head,) = claim(engine, client_id, db_now, queue=Q, limit=10)
        ran.append(head.id)
        assert finalize(engine, db_now, result(head, "completed"))

    assert ran == [j.id for j in jobs]


def test_ordering__a_snoozed_head_holds_the_key_until_it_runs_again(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    a1, _a2 = keyed(engine, db_now, "a", 2)
    (head,) = claim(engine, client_id, db_now, queue=Q)
    finalize(engine, db_now, result(head, "scheduled", delay=MINUTE, snooze=True))

    assert claim(engine, client_id, db_now + SECOND, queue=Q) == []
    (again,) = claim(engine, client_id, db_now + 2 * MINUTE, queue=Q)
    assert again.id == a1.id


def test_ordering__a_retried_head_holds_the_key_and_a_canceled_one_releases_it(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    a1, a2 = keyed(engine, db_now, "a", 2)
    (head,) = claim(engine, client_id, db_now, queue=Q)
    finalize(engine, db_now, result(head, "retryable", delay=MINUTE))
    assert claim(engine, client_id, db_now + SECOND, queue=Q) == []

    (again,) = claim(engine, client_id, db_now + 2 * MINUTE, queue=Q)
    finalize(engine, db_now + 2 * MINUTE, result(again, "discarded"))
    (nxt,) = claim(engine, client_id, db_now + 2 * MINUTE, queue=Q)
    assert (again.id, nxt.id) == (a1.id, a2.id)


def test_ordering__a_head_whose_client_died_holds_the_key_until_rescued(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    keyed(engine, db_now, "a", 2)
    (head,) = claim(engine, client_id, db_now, queue=Q)
    assert head.state == "running"
    # The client is gone, the job still runs: nothing else of the key is claimable.
    engine.client_delete(client_id)
    assert claim(engine, client_id + 1000, db_now, queue=Q) == []


def test_ordering__pending_jobs_do_not_hold_the_key(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    a1, a2 = keyed(engine, db_now, "a", 2)
    Job.objects.filter(id=a1.id).update(state="pending")

    (got,) = claim(engine, client_id, db_now, queue=Q)
    assert got.id == a2.id
    # Once promoted, the older job waits while the newer one runs.
    Job.objects.filter(id=a1.id).update(state="available")
    assert claim(engine, client_id, db_now, queue=Q) == []


def test_ordering__expired_and_future_heads_block_nothing_else_of_other_keys(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    keyed(engine, db_now, "a", scheduled_at=db_now + HOUR)
    (b,) = keyed(engine, db_now, "b")
    keyed(engine, db_now, "a")

    assert [j.id for j in claim(engine, client_id, db_now, queue=Q)] == [b.id]


def test_retry_ordering_key__wakes_waiting_jobs_oldest_first_keeping_ttl(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    later = db_now + HOUR
    a1, a2, a3 = keyed(engine, db_now, "a", 3, scheduled_at=later, ttl=2 * HOUR)
    (expired,) = keyed(engine, db_now - 3 * HOUR, "a", scheduled_at=later, ttl=HOUR)
    (other,) = keyed(engine, db_now, "b", scheduled_at=later)

    assert wake(engine, db_now, "a", limit=2) == 2

    rows = [get(engine, j) for j in (a1, a2, a3, expired, other)]
    assert [r.state for r in rows] == [
        "available",
        "available",
        "scheduled",
        "scheduled",
        "scheduled",
    ]
    assert rows[0].scheduled_at == db_now
    assert rows[0].expires_at == a1.expires_at
    assert wake(engine, db_now, "a") == 1


def test_retry_ordering_key__clears_the_snooze_reason(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    keyed(engine, db_now, "a")
    (head,) = claim(engine, client_id, db_now, queue=Q)
    finalize(
        engine, db_now, result(head, "scheduled", delay=HOUR, snooze=True, snooze_reason="wait")
    )

    assert wake(engine, db_now, "a") == 1
    row = get(engine, head)
    assert (row.state, row.snooze_reason) == ("available", None)


def test_retry_ordering_key__a_marked_running_job_that_snoozes_is_claimable_at_once(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    keyed(engine, db_now, "a", 2)
    (head,) = claim(engine, client_id, db_now, queue=Q)

    assert wake(engine, db_now, "a") == 0
    finalize(engine, db_now, result(head, "scheduled", delay=HOUR, snooze=True))

    (again,) = claim(engine, client_id, db_now + SECOND, queue=Q)
    assert again.id == head.id
    assert WAKE_MARKER not in again.metadata
    assert WAKE_MARKER not in get(engine, head).metadata


@pytest.mark.parametrize("outcome", ["completed", "discarded", "canceled"])
def test_retry_ordering_key__the_wake_marker_never_reaches_history(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, outcome: str
) -> None:
    keyed(engine, db_now, "a", 2, metadata={"team": "x"})
    (head,) = claim(engine, client_id, db_now, queue=Q)
    assert wake(engine, db_now, "a") == 0  # marks the running head

    finalize(engine, db_now, result(head, outcome, output=1))

    assert get(engine, head).metadata == {"team": "x"}


def test_retry_ordering_key__a_marked_job_canceled_while_waiting_leaves_no_marker(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    from django_hopper.engine.params import JobCancelParams

    keyed(engine, db_now, "a", 1, metadata={"team": "x"})
    (head,) = claim(engine, client_id, db_now, queue=Q)
    assert wake(engine, db_now, "a") == 0
    finalize(engine, db_now, result(head, "retryable", delay=HOUR))  # keeps its mark, waiting

    engine.job_cancel(JobCancelParams(id=head.id, now=db_now + SECOND))

    assert get(engine, head).metadata == {"team": "x"}


def test_retry_ordering_key__bad_input_is_refused(engine: BaseEngine, db_now: dt.datetime) -> None:
    import pytest

    from django_hopper.exceptions import InvalidJob, UnknownQueue

    with pytest.raises(UnknownQueue):
        engine.job_retry_ordering_key(JobRetryOrderingKeyParams(queue="", ordering_key="a"))
    with pytest.raises(InvalidJob) as err:
        engine.job_retry_ordering_key(JobRetryOrderingKeyParams(queue=Q, ordering_key=""))
    assert err.value.field == "ordering_key"


def test_ordering__a_claim_behind_a_long_key_takes_only_heads(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    """10,000 jobs behind one head and 1,000 other keys: a claim takes the heads only.

    The hot key's waiting jobs fill the claim's window, so this claim falls back
    to walking the keys. What that costs is measured by the benchmark
    (``bench.run``: ``keyed_claim``), not asserted here.
    """
    params = [JobInsertParams(kind="tests.job", queue=Q, ordering_key="hot")] * 10_000
    params += [
        JobInsertParams(kind="tests.job", queue=Q, ordering_key=f"k{i:04}") for i in range(1000)
    ]
    for start in range(0, len(params), 2000):
        insert_many(engine, params[start : start + 2000], db_now)

    got = claim(engine, client_id, db_now, queue=Q, limit=50)
    assert len(got) == 50
    assert len({j.ordering_key for j in got}) == 50

    later = [j for _ in range(5) for j in claim(engine, client_id, db_now, queue=Q, limit=10)]
    keys = [j.ordering_key for j in got + later]
    assert len(later) == 50
    assert len(set(keys)) == len(keys)  # one job per key: never a second job of a running key


def _claim_order(job: JobRow) -> tuple:
    return (-job.priority, job.scheduled_at, job.id)


@pytest.mark.parametrize("path", ["unlimited", "global_limit", "partition_limit"])
@pytest.mark.parametrize("blocker", ["running", "backing_off"])
def test_ordering__heads_beyond_a_window_full_of_blocked_jobs_are_found(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, blocker: str, path: str
) -> None:
    """More blocked jobs than the claim's window rank ahead of every head.

    The window is 4 * n + 400 rows in claim order (n = limit, or the partition
    scan of 10 * limit + 100 with a partition limit): 1,100 waiting jobs of a key
    whose head runs (or backs off) fill it without a single head, so the claim
    must fall back to walking the keys, and still take the best heads.
    """
    if blocker == "running":
        (hot,) = keyed(engine, db_now, "hot", priority=3)
        assert [j.id for j in claim(engine, client_id, db_now, queue=Q, limit=1)] == [hot.id]
    else:
        keyed(engine, db_now, "hot", priority=3, scheduled_at=db_now + HOUR)
    keyed(engine, db_now, "hot", 1100, priority=3)
    heads = [keyed(engine, db_now, f"k{i}", 2, priority=i % 3)[0] for i in range(10)]
    plain = [insert(engine, db_now, queue=Q, priority=p) for p in (2, 0, 1, 0)]
    if path != "unlimited":
        limits = {"global_limit": 1000} if path == "global_limit" else {"partition_limit": 5}
        engine.queue_set_limits(QueueLimits(name=Q, **limits), now=db_now)  # type: ignore[arg-type]
    best = [j.id for j in sorted(heads + plain, key=_claim_order)]

    def take(limit: int) -> list[JobRow]:
        params = JobClaimParams(
            queue=Q, client_id=client_id, limit=limit, limited=path != "unlimited", now=db_now
        )
        return engine.job_claim(params).jobs

    first = take(5)
    rest = take(50)

    assert [j.id for j in first] == best[:5]
    # The second job of each key waits behind its running head; "hot" never yields.
    assert [j.id for j in rest] == best[5:]


def test_ordering__many_keys_and_plain_jobs_are_claimed_in_claim_order(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    """Per-job priorities, keys of 1-3 jobs and plain jobs: every claim takes the best heads.

    A later job of a key may outrank its head; it must wait all the same. Some
    claimed jobs keep running, so their keys' waiting jobs pile up in the window.
    """
    rng = random.Random(20261129)
    params = [
        JobInsertParams(
            kind="tests.job",
            queue=Q,
            ordering_key=f"k{rng.randrange(250):03}" if rng.random() < 0.85 else None,
            priority=rng.randint(-1, 2),
            scheduled_at=db_now - SECOND * rng.randrange(600),
        )
        for _ in range(700)
    ]
    live = {r.job.id: r.job for r in insert_many(engine, params, db_now)}
    running: set = set()

    def expected(limit: int) -> list:
        blocked = {live[i].ordering_key for i in running}
        cands, seen = [], set()
        for job in sorted(live.values(), key=lambda j: j.id):
            key = job.ordering_key
            if key is None:
                if job.id not in running:
                    cands.append(job)
            elif key not in blocked and key not in seen:
                seen.add(key)
                cands.append(job)
        return [j.id for j in sorted(cands, key=_claim_order)[:limit]]

    for _ in range(200):
        want = expected(10)
        got = claim(engine, client_id, db_now, queue=Q, limit=10)
        assert [j.id for j in got] == want
        if not got:
            break
        # One claimed job in three keeps running (and blocks its key); the rest complete.
        done = [j for n, j in enumerate(got) if n % 3]
        running.update(j.id for n, j in enumerate(got) if not n % 3)
        finalize(engine, db_now, *(result(j, "completed") for j in done))
        for j in done:
            del live[j.id]
    else:
        raise AssertionError("the queue never drained")
    assert len(running) > 10
