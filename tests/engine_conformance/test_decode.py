"""One stored value that does not decode affects its own row only.

A job whose ``progress``, ``errors``, ``tags`` or ``metadata`` has the wrong
shape (or, on SQLite, whose time or UUID text does not parse) reads with that field empty and
``decode_error`` naming it; every other row of a read is unaffected; a claim
returns the healthy jobs and fails the bad job's attempt with the reason
(docs/engine-semantics.md, "Values that do not decode").
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pytest
from django.db import connection

from django_hopper.engine import decode
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.decode import EPOCH, Codec
from django_hopper.engine.encode import dump_json
from django_hopper.engine.params import (
    JobCancelParams,
    JobClaimByIDParams,
    JobClaimParams,
    JobDeleteParams,
    JobListParams,
    JobRescueParams,
)
from django_hopper.engine.postgres.convert import load_json
from django_hopper.engine.queries import JOB_COLUMNS
from django_hopper.exceptions import JobNotClaimable
from django_hopper.types import JobRow, QueueLimits, RescueReason
from tests.engine_conformance.support import HOUR, MINUTE, claim, insert, register, store_raw

SQLITE = connection.vendor == "sqlite"
sqlite_only = pytest.mark.skipif(not SQLITE, reason="PostgreSQL stores only valid jsonb and times")

#: (column, stored JSON, the field as read, words of the decode error).
BAD_JSON_SHAPES = [
    ("progress", '"halfway"', None, "progress: expected a JSON object"),
    ("progress", "[1, 2]", None, "progress: expected a JSON object, not a list"),
    ("progress", '{"step": "import", "at": "not a date"}', None, "progress: "),
    ("progress", '{"step": "import", "at": 5}', None, "progress: at must be an ISO 8601 time"),
    ("progress", '{"step": 5}', None, "progress: step must be a string"),
    ("metadata", "[1]", {}, "metadata: expected a JSON object, not a list"),
    ("tags", '"urgent"', [], "tags: expected a list of strings"),
    ("tags", "[1, 2]", [], "tags: expected a list of strings"),
    ("errors", '"boom"', [], "errors: expected a list of objects"),
    ("errors", "[1]", [], "errors: expected a list of objects, not a list holding"),
    ("errors", '[{"at": "yesterday", "attempt": 1, "error": "e"}]', [], "errors: "),
]
BAD_IDS = [f"{c}-{i}" for i, (c, *_) in enumerate(BAD_JSON_SHAPES)]


def read(engine: BaseEngine, job: JobRow) -> JobRow:
    row = engine.job_get(job.id)
    assert row is not None
    return row


def assert_healthy(row: JobRow, original: JobRow) -> None:
    assert row.decode_error is None
    assert (row.id, row.args, row.metadata, row.tags) == (
        original.id,
        original.args,
        original.metadata,
        original.tags,
    )


@pytest.mark.parametrize(("column", "text", "empty", "words"), BAD_JSON_SHAPES, ids=BAD_IDS)
def test_decode__a_bad_value_reads_empty_with_its_error_on_that_row_alone(
    engine: BaseEngine, db_now: dt.datetime, column: str, text: str, empty: Any, words: str
) -> None:
    before = insert(engine, db_now, queue="reads", args={"n": 1}, tags=["a"])
    bad = insert(engine, db_now, queue="reads", args={"n": 2}, metadata={"m": 1})
    after = insert(engine, db_now, queue="reads", args={"n": 3})
    store_raw(bad.id, column, text)

    row = read(engine, bad)
    listed = engine.job_list(JobListParams(queue="reads", limit=10))

    assert row.decode_error is not None and words in row.decode_error
    assert getattr(row, column) == empty
    assert (row.id, row.kind, row.state, row.queue) == (bad.id, bad.kind, bad.state, bad.queue)
    assert [j.id for j in listed] == [before.id, bad.id, after.id]
    assert listed[1].decode_error == row.decode_error
    assert_healthy(listed[0], before)
    assert_healthy(listed[2], after)
    assert_healthy(read(engine, after), after)


def test_decode__every_bad_field_of_a_row_is_named(engine: BaseEngine, db_now: dt.datetime) -> None:
    job = insert(engine, db_now, args={"kept": True})
    store_raw(job.id, "progress", "[]")
    store_raw(job.id, "tags", "{}")

    row = read(engine, job)

    assert row.decode_error is not None
    assert "progress: " in row.decode_error and "tags: " in row.decode_error
    assert row.args == {"kept": True}, "a field that decodes is kept"


@sqlite_only
@pytest.mark.parametrize(
    ("column", "text", "empty"),
    [
        ("scheduled_at", "not a time", EPOCH),
        ("created_at", "", EPOCH),
        ("created_at", "2026-13-45 99:99:99", EPOCH),
        ("attempted_at", "2026-02-30 10:00:00", None),
        ("batch_id", "not-a-uuid", None),
    ],
)
def test_decode__a_time_or_uuid_sqlite_cannot_read_is_a_decode_error_of_its_row(
    engine: BaseEngine, db_now: dt.datetime, column: str, text: str, empty: Any
) -> None:
    ok = insert(engine, db_now, queue="reads", tags=["x"], metadata={"m": 1})
    bad = insert(engine, db_now, queue="reads")
    store_raw(bad.id, column, text)

    row = read(engine, bad)
    listed = engine.job_list(JobListParams(queue="reads", limit=10))
    filtered = engine.job_list(
        JobListParams(queue="reads", tags_any=("x",), metadata={"m": 1}, limit=10)
    )

    assert row.decode_error is not None and row.decode_error.startswith(f"{column}: ")
    assert getattr(row, column) == empty
    assert [j.id for j in listed] == [ok.id, bad.id]
    assert [j.id for j in filtered] == [ok.id], "filters read past a value that is not JSON"


@pytest.mark.parametrize(("column", "text", "empty", "words"), BAD_JSON_SHAPES, ids=BAD_IDS)
def test_claim__returns_the_healthy_jobs_and_fails_the_undecodable_one_with_its_reason(
    engine: BaseEngine,
    db_now: dt.datetime,
    client_id: int,
    column: str,
    text: str,
    empty: Any,
    words: str,
) -> None:
    first = insert(engine, db_now, queue="poison", priority=3)
    bad = insert(engine, db_now, queue="poison", priority=2, max_attempts=5)
    last = insert(engine, db_now, queue="poison", priority=1)
    store_raw(bad.id, column, text)

    claimed = claim(engine, client_id, db_now, queue="poison", limit=10)

    assert [j.id for j in claimed] == [first.id, last.id]
    assert all(j.state == "running" and j.decode_error is None for j in claimed)
    row = read(engine, bad)
    assert row.state == "retryable"
    assert row.scheduled_at > db_now, "retried after backoff, like any failed attempt"
    # The bad value stays for an operator to see (and correct) until the next attempt.
    assert row.decode_error is not None and row.decode_error.startswith(f"{column}: ")
    if column != "errors":  # errors: the new entry is appended to a value that does not decode
        (error,) = row.errors
        assert error.rescue == RescueReason.UNDECODABLE
        assert error.attempt == 1 and error.fence == 1
        assert error.error.startswith("stored values do not decode: ") and words in error.error


@pytest.mark.parametrize("column", ["progress", "errors"])
def test_claim__discards_an_undecodable_job_on_its_last_attempt(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, column: str
) -> None:
    bad = insert(engine, db_now, queue="poison", max_attempts=1)
    ok = insert(engine, db_now, queue="poison")
    store_raw(bad.id, column, '"x"')

    claimed = claim(engine, client_id, db_now, queue="poison", limit=10)

    assert [j.id for j in claimed] == [ok.id]
    row = read(engine, bad)
    assert row.state == "discarded" and row.finalized_at is not None
    if column == "progress":
        assert row.errors[-1].rescue == RescueReason.UNDECODABLE


def test_claim__a_queue_with_an_undecodable_job_keeps_running(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    bad = insert(engine, db_now, queue="poison", max_attempts=3, priority=5)
    store_raw(bad.id, "progress", "[1]")
    ok = [insert(engine, db_now, queue="poison") for _ in range(3)]

    got: list[Any] = []
    now = db_now
    for _ in range(6):
        got += [j.id for j in claim(engine, client_id, now, queue="poison", limit=1)]
        now += HOUR  # past every backoff: the bad job is claimed again each round

    assert got == [o.id for o in ok]
    row = read(engine, bad)
    assert row.state == "discarded"
    assert row.attempt == 3


def test_claim__limited_path_fails_the_undecodable_job_alone(
    engine: BaseEngine, db_now: dt.datetime, client_id: int
) -> None:
    engine.queue_set_limits(QueueLimits(name="limited", global_limit=10), now=db_now)  # type: ignore[attr-defined]
    bad = insert(engine, db_now, queue="limited", max_attempts=2)
    ok = insert(engine, db_now, queue="limited")
    store_raw(bad.id, "progress", '"x"')

    result = engine.job_claim(
        JobClaimParams(queue="limited", client_id=client_id, limit=5, now=db_now, limited=True)
    )

    assert [j.id for j in result.jobs] == [ok.id]
    assert read(engine, bad).state == "retryable"


def test_claim_by_id__refuses_an_undecodable_job_and_fails_its_attempt(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    bad = insert(engine, db_now, queue="leased", max_attempts=4)
    store_raw(bad.id, "progress", '{"step": "import", "at": "never"}')

    with pytest.raises(JobNotClaimable, match="progress: "):
        engine.job_claim_by_id(  # type: ignore[attr-defined]
            JobClaimByIDParams(id=bad.id, fence=bad.fence, ttl=MINUTE, now=db_now)
        )

    row = read(engine, bad)
    assert row.state == "retryable" and row.attempt == 1
    assert row.errors[-1].rescue == RescueReason.UNDECODABLE


def test_rescue__ends_a_running_job_whose_values_stopped_decoding(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    from django_hopper.maintenance import Rescuer

    gone = register(engine, db_now, ttl=MINUTE)
    insert(engine, db_now, queue="rescue")
    (job,) = claim(engine, gone, db_now, queue="rescue", limit=1)
    store_raw(job.id, "progress", '"corrupt"')
    later = db_now + HOUR

    (candidate,) = engine.job_rescue_candidates(JobRescueParams(now=later))
    rescued = Rescuer(engine).run_once(now=later)

    assert candidate.job.id == job.id and candidate.job.decode_error is not None
    assert rescued == 1
    assert read(engine, job).state == "retryable"


@pytest.mark.parametrize(("text", "still_bad"), [('"boom"', True), ('{"a": 1}', False)])
def test_cancel_and_delete__work_on_a_job_whose_errors_do_not_decode(
    engine: BaseEngine, db_now: dt.datetime, text: str, still_bad: bool
) -> None:
    canceled = insert(engine, db_now)
    deleted = insert(engine, db_now)
    store_raw(canceled.id, "errors", text)
    store_raw(deleted.id, "errors", text)

    row = engine.job_cancel(JobCancelParams(id=canceled.id, now=db_now))
    gone = engine.job_delete(JobDeleteParams(id=deleted.id))

    # The cancel's entry is appended as PostgreSQL's || does: a scalar becomes the
    # first element (still not an error object), an object a first entry.
    assert row.state == "canceled"
    assert (row.decode_error is not None) == still_bad
    if not still_bad:
        assert row.errors[-1].rescue == "canceled"
    assert gone.id == deleted.id
    assert engine.job_get(deleted.id) is None


def test_api__get_job_and_list_jobs_report_a_bad_row_and_read_every_other(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    from django_hopper import api

    ok = insert(engine, db_now, queue="api-reads", args={"n": 1})
    bad = insert(engine, db_now, queue="api-reads", args={"n": 2})
    store_raw(bad.id, "progress", '"halfway"')

    row = api.get_job(bad.id)
    page = api.list_jobs(queue="api-reads")

    assert row.progress is None and row.decode_error is not None
    assert row.decode_error.startswith("progress: expected a JSON object")
    assert [(j.id, j.decode_error is None) for j in page] == [(ok.id, True), (bad.id, False)]


@pytest.mark.parametrize("typed", [True, False], ids=["driver-typed", "codec-converted"])
def test_decode__the_one_pass_decoder_reads_each_column_into_its_field(typed: bool) -> None:
    # Every column holds a value of its own, so a column read into the wrong field
    # shows; the field-by-field decoder (by column name) is the reference.
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    times = {f"<{c}>": base + dt.timedelta(minutes=i) for i, c in enumerate(JOB_COLUMNS)}
    ids = {"<id>": uuid.uuid4(), "<batch_id>": uuid.uuid4()}
    stored_json = {
        "<args>": {"args": [1], "kwargs": {}},
        "<metadata>": {"m": 1},
        "<errors>": [],
        "<tags>": ["t"],
        "<progress>": {"step": "s"},
        "<output>": {"o": 1},
    }
    row: dict[str, Any] = {c: f"<{c}>" for c in JOB_COLUMNS}
    row.update(state="scheduled", priority=3, attempt=2, max_attempts=9, attempted_by=7, fence=5)
    row["awaited"] = 1
    if typed:
        row.update({c: times[f"<{c}>"] for c in _TIME_COLUMNS})
        row.update(id=ids["<id>"], batch_id=ids["<batch_id>"])
        codec = Codec(json=stored_json.__getitem__)
    else:
        codec = Codec(json=stored_json.__getitem__, time=times.__getitem__, uuid=ids.__getitem__)
    values = tuple(row[c] for c in JOB_COLUMNS)

    job = decode.job_from_row(values, codec)
    reference = decode._tolerant(values, codec)

    assert job.decode_error is None
    assert job == dataclasses.replace(reference, decode_error=None)
    assert (job.id, job.batch_id) == (ids["<id>"], ids["<batch_id>"])
    assert (job.scheduled_at, job.erased_at) == (times["<scheduled_at>"], times["<erased_at>"])
    assert (job.kind, job.step, job.subject, job.snooze_reason) == (
        "<kind>",
        "<step>",
        "<subject>",
        "<snooze_reason>",
    )
    assert job.progress is not None and job.progress.step == "s"
    assert (job.args, job.output, job.tags, job.awaited) == (
        {"args": [1], "kwargs": {}},
        {"o": 1},
        ["t"],
        True,
    )
    assert decode.job_from_row((*values, "an extra column"), codec) == job


_TIME_COLUMNS = (
    "scheduled_at", "attempted_at", "expires_at", "cancel_requested_at", "created_at",
    "lease_expires_at", "lease_renewed_at", "erased_at", "finalized_at",
)  # fmt: skip


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _Str(str):
    __slots__ = ()


@pytest.mark.parametrize(
    ("value", "normal"),
    [
        (None, True),
        ({}, True),
        ([], True),
        ("s", True),
        ({"a": [1, 2.5, True, None, {"b": "c"}]}, True),
        ([[[{"deep": []}]]], True),
        ({1: "a"}, False),
        ({"a": [{True: 1}]}, False),
        ((1, 2), False),
        ({"a": [1, (2,)]}, False),
        (_Dict(a=1), False),
        ({"a": _Dict()}, False),
        (_Str("s"), False),
        ({"a": [_Str("s")]}, False),
        ({_Str("k"): 1}, False),
    ],
)
def test_decode__json_normal_is_whether_a_value_reads_back_as_itself(
    value: Any, normal: bool
) -> None:
    """The inserted row keeps the caller's JSON only when a read would return
    an equal value of the same types (``decode.as_stored``)."""
    assert decode.json_normal(value) is normal
    text = dump_json(value, "args")
    stored = decode.as_stored(value, text, load_json)
    assert stored == load_json(text)
    assert (stored is value) is normal
