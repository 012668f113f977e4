"""The validation front: every engine refuses the same bad input the same way.

Each rule is pinned against the engine directly (not through the api), on both
engines: the call raises InvalidJob naming the field, and nothing is written.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    BatchInsertParams,
    BatchSettleParams,
    ClientRegisterParams,
    ClientRenewParams,
    JobAgeParams,
    JobClaimByIDParams,
    JobClaimParams,
    JobDiscardExpiredParams,
    JobExpireLeasesParams,
    JobFinalize,
    JobFinalizeParams,
    JobInsertOpts,
    JobInsertParams,
    JobListParams,
    JobRecordProgressParams,
    JobRescueParams,
    JobRetryOrderingKeyParams,
    JobScheduleParams,
    JobStepGetParams,
    JobStepRecordParams,
    LeaderParams,
    MessagePublishParams,
    StreamAppendParams,
    StreamPruneParams,
    StreamReadParams,
    WorkflowInsertParams,
    WorkflowPromoteParams,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.models import Batch, Job, Queue, StreamEvent
from django_hopper.types import QueueLimits
from tests.engine_conformance.support import HOUR, insert, running

LONG = "x" * 256
AWARE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def refused(call: Callable[[], Any], field: str) -> InvalidJob:
    """Run ``call``; assert it raised InvalidJob naming ``field``; return the error."""
    with pytest.raises(InvalidJob) as info:
        call()
    assert info.value.field == field, f"{info.value!r} names {info.value.field!r}, not {field!r}"
    return info.value


# -- the insert rules ---------------------------------------------------------

#: (field the error names, a JobInsertParams field set to a bad value)
BAD_INSERTS: list[tuple[str, dict[str, Any]]] = [
    ("kind", {"kind": ""}),
    ("kind", {"kind": "k" * 300}),
    ("kind", {"kind": 7}),
    ("queue", {"queue": ""}),
    ("queue", {"queue": "with space"}),
    ("queue", {"queue": "default\n"}),
    ("queue", {"queue": "q" * 129}),
    ("queue", {"queue": None}),
    ("priority", {"priority": 101}),
    ("priority", {"priority": -101}),
    ("priority", {"priority": True}),
    ("priority", {"priority": 1.5}),
    ("max_attempts", {"max_attempts": 0}),
    ("max_attempts", {"max_attempts": -1}),
    ("max_attempts", {"max_attempts": False}),
    ("scheduled_at", {"scheduled_at": dt.datetime(2030, 1, 1)}),  # naive
    ("ttl", {"ttl": dt.timedelta(seconds=-1)}),
    ("ttl", {"ttl": dt.timedelta(0)}),
    ("unique_key", {"unique_key": ""}),
    ("unique_key", {"unique_key": "u" * 300}),
    ("ordering_key", {"ordering_key": ""}),
    ("ordering_key", {"ordering_key": "o" * 300}),
    ("partition_key", {"partition_key": "p" * 300}),
    ("subject", {"subject": ""}),
    ("subject", {"subject": "s" * 300}),
    ("tags", {"tags": ("",)}),
    ("tags", {"tags": "abc"}),
    ("tags", {"tags": (1,)}),
    ("unique_finished", {"unique_finished": ("running",)}),
    ("id", {"id": "not-a-uuid"}),
    ("batch_id", {"batch_id": "not-a-uuid"}),
    # What one database stores and the other refuses is refused by both.
    ("kind", {"kind": "tests.\x00job"}),
    ("unique_key", {"unique_key": "u\x00"}),
    ("ordering_key", {"ordering_key": "o\x00"}),
    ("partition_key", {"partition_key": "p\x00"}),
    ("subject", {"subject": "s\x00"}),
    ("tags", {"tags": ("t\x00",)}),
    ("args", {"args": {"x": "a\x00b"}}),
    ("args", {"args": {"x": [1, {"y\x00": 2}]}}),
    ("args", {"args": {"x": float("nan")}}),
    ("args", {"args": {"x": object()}}),
    ("metadata", {"metadata": {"x": "a\x00b"}}),
    ("metadata", {"metadata": [1, 2]}),
    ("ttl", {"ttl": dt.timedelta(days=10**8)}),
    ("args", {"args": {"x": (loop := [1]), "y": loop.append(loop)}}),  # contains itself
    # A lone surrogate has no UTF-8 form: one engine's JSON refuses it, the other kept it.
    ("args", {"args": {"x": "a\udcffb"}}),
    ("args", {"args": {"k\ud800": 1}}),
    ("metadata", {"metadata": {"x": ["\udfff"]}}),
    # ...nor in a text column: SQLite stored a row it then could not read back.
    ("kind", {"kind": "tests.\udcffjob"}),
    ("unique_key", {"unique_key": "u\udcff"}),
    ("ordering_key", {"ordering_key": "o\ud800"}),
    ("partition_key", {"partition_key": "p\udcff"}),
    ("subject", {"subject": "s\udcff"}),
    ("tags", {"tags": ("t\udcff",)}),
]


def bad_insert(fields: dict[str, Any]) -> JobInsertParams:
    return JobInsertParams(**{"kind": "tests.job", **fields})


@pytest.mark.parametrize(("field", "fields"), BAD_INSERTS, ids=lambda v: repr(v)[:40])
def test_validation__job_insert_many_refuses_a_bad_input_naming_its_field(
    engine: BaseEngine, db_now: dt.datetime, field: str, fields: dict[str, Any]
) -> None:
    good = JobInsertParams(kind="tests.good")

    refused(lambda: engine.job_insert_many([good, bad_insert(fields)]), field)

    assert Job.objects.count() == 0


@pytest.mark.parametrize("n", [1, 2])
def test_validation__characters_beyond_u_ffff_and_hangul_are_stored_as_sent(
    engine: BaseEngine, n: int
) -> None:
    text = "\U0001f600 \ud55c\uae00 \U00020000"  # a pair each, and U+D55C U+AE00 as one
    params = [
        JobInsertParams(kind="tests.job", args={text: [text]}, metadata={"m": text})
        for _ in range(n)
    ]
    for result in engine.job_insert_many(params):
        row = engine.job_get(result.job.id)
        assert row is not None
        assert (row.args, row.metadata) == ({text: [text]}, {"m": text})


@pytest.mark.parametrize(("field", "fields"), BAD_INSERTS, ids=lambda v: repr(v)[:40])
def test_validation__a_one_job_insert_refuses_what_a_batch_refuses(
    engine: BaseEngine, field: str, fields: dict[str, Any]
) -> None:
    refused(lambda: engine.job_insert_many([bad_insert(fields)]), field)

    assert Job.objects.count() == 0


@pytest.mark.parametrize(("field", "fields"), BAD_INSERTS, ids=lambda v: repr(v)[:40])
def test_validation__job_insert_copy_refuses_what_job_insert_many_refuses(
    engine: BaseEngine, field: str, fields: dict[str, Any]
) -> None:
    if not engine.features.supports_copy:
        pytest.skip("engine has no COPY")
    if "unique_key" in fields:
        field = "unique_key"  # COPY refuses every unique key

    refused(lambda: engine.job_insert_copy([bad_insert(fields)]), field)

    assert Job.objects.count() == 0


@pytest.mark.parametrize(("field", "fields"), BAD_INSERTS[:12], ids=lambda v: repr(v)[:40])
def test_validation__workflow_and_batch_callbacks_refuse_a_bad_job(
    engine: BaseEngine, field: str, fields: dict[str, Any]
) -> None:
    bad = bad_insert(fields)
    refused(
        lambda: engine.workflow_insert(WorkflowInsertParams(name="wf", jobs=[bad])),
        field,
    )
    refused(lambda: engine.batch_insert(BatchInsertParams(total=1, on_complete=bad)), field)

    assert Job.objects.count() == 0
    assert Batch.objects.count() == 0


def test_validation__args_that_contain_themselves_are_refused_as_circular(
    engine: BaseEngine,
) -> None:
    looped: dict[str, Any] = {"args": [], "kwargs": {}}
    looped["kwargs"]["self"] = looped

    error = refused(
        lambda: engine.job_insert_many([JobInsertParams("tests.job", args=looped)]), "args"
    )

    assert "Circular reference detected" in str(error)
    assert Job.objects.count() == 0


def test_validation__an_unknown_conflict_action_is_refused(engine: BaseEngine) -> None:
    refused(
        lambda: engine.job_insert_many(
            [JobInsertParams(kind="tests.job")], JobInsertOpts(on_conflict="merge")
        ),
        "on_conflict",
    )
    assert Job.objects.count() == 0


def test_validation__a_negative_batch_total_is_refused(engine: BaseEngine) -> None:
    refused(lambda: engine.batch_insert(BatchInsertParams(total=-1)), "total")
    assert Batch.objects.count() == 0


# -- limits ------------------------------------------------------------------


def limit_calls(engine: BaseEngine, client_id: int) -> dict[str, Callable[[Any], Any]]:
    """Every engine method that takes a limit, called with the given limit."""
    return {
        "job_claim": lambda n: engine.job_claim(
            JobClaimParams(queue="default", client_id=client_id, limit=n)
        ),
        "job_claim.limited": lambda n: engine.job_claim(
            JobClaimParams(queue="default", client_id=client_id, limit=n, limited=True)
        ),
        "job_schedule": lambda n: engine.job_schedule(JobScheduleParams(limit=n)),
        "job_list": lambda n: engine.job_list(JobListParams(limit=n)),
        "job_discard_expired": lambda n: engine.job_discard_expired(
            JobDiscardExpiredParams(limit=n)
        ),
        "job_rescue_candidates": lambda n: engine.job_rescue_candidates(JobRescueParams(limit=n)),
        "job_retry_ordering_key": lambda n: engine.job_retry_ordering_key(
            JobRetryOrderingKeyParams(queue="default", ordering_key="k", limit=n)
        ),
        "job_expire_leases": lambda n: engine.job_expire_leases(
            JobExpireLeasesParams(limit=n, client_id=client_id)
        ),
        "batch_settle": lambda n: engine.batch_settle(BatchSettleParams(limit=n)),
        "workflow_promote_ready": lambda n: engine.workflow_promote_ready(
            WorkflowPromoteParams(limit=n)
        ),
        "stream_read": lambda n: engine.stream_read(StreamReadParams(limit=n)),
        "stream_prune": lambda n: engine.stream_prune(StreamPruneParams(retention=HOUR, limit=n)),
    }


LIMITED_METHODS = [
    "job_claim",
    "job_claim.limited",
    "job_schedule",
    "job_list",
    "job_discard_expired",
    "job_rescue_candidates",
    "job_retry_ordering_key",
    "job_expire_leases",
    "batch_settle",
    "workflow_promote_ready",
    "stream_read",
    "stream_prune",
]


@pytest.mark.parametrize("method", LIMITED_METHODS)
@pytest.mark.parametrize("limit", [-1, -1000, 1.5, "5", True, None])
def test_validation__every_limit_must_be_a_non_negative_integer(
    engine: BaseEngine, client_id: int, method: str, limit: Any
) -> None:
    insert(engine, engine.now(), scheduled_at=AWARE)  # something a bad limit could touch

    refused(lambda: limit_calls(engine, client_id)[method](limit), "limit")


@pytest.mark.parametrize("method", [m for m in LIMITED_METHODS if m != "workflow_promote_ready"])
def test_validation__a_zero_limit_does_nothing(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, method: str
) -> None:
    job = insert(engine, db_now)

    out = limit_calls(engine, client_id)[method](0)

    assert not (out.jobs if hasattr(out, "jobs") else out) or method == "batch_settle"
    assert Job.objects.get(id=job.id).state == "available"


def test_validation__workflow_promote_ready_needs_a_positive_limit(engine: BaseEngine) -> None:
    refused(lambda: engine.workflow_promote_ready(WorkflowPromoteParams(limit=0)), "limit")


def test_validation__stream_pump_refuses_a_negative_limit(engine: BaseEngine) -> None:
    refused(lambda: engine.stream_pump("nobody", -1), "limit")


def test_validation__finalize_refuses_negative_keep_logs(engine: BaseEngine) -> None:
    refused(lambda: engine.job_finalize_many(JobFinalizeParams(jobs=[], keep_logs=-1)), "keep_logs")


# -- finalize, listing, leases, steps ---------------------------------------


@pytest.mark.parametrize("state", ["running", "available", "pending", "done", ""])
def test_validation__a_result_must_end_or_reschedule_the_attempt(
    engine: BaseEngine, db_now: dt.datetime, state: str
) -> None:
    job = insert(engine, db_now)
    result = JobFinalize(id=job.id, attempted_by=None, fence=1, state=state)

    refused(lambda: engine.job_finalize_many(JobFinalizeParams(jobs=[result])), "state")


def test_validation__a_result_cannot_wait_a_negative_delay(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    job = insert(engine, db_now)
    result = JobFinalize(
        id=job.id, attempted_by=None, fence=1, state="retryable", delay=-dt.timedelta(seconds=1)
    )

    refused(lambda: engine.job_finalize_many(JobFinalizeParams(jobs=[result])), "delay")


@pytest.mark.parametrize(
    ("field", "params"),
    [
        ("ordering_key", JobListParams(ordering_key="k")),
        ("states", JobListParams(states=("done",))),
        ("metadata", JobListParams(metadata=["x"])),  # type: ignore[arg-type]
    ],
)
def test_validation__job_list_refuses_a_filter_that_cannot_mean_anything(
    engine: BaseEngine, field: str, params: JobListParams
) -> None:
    refused(lambda: engine.job_list(params), field)


@pytest.mark.parametrize("ttl", [dt.timedelta(0), dt.timedelta(seconds=-5), 30])
def test_validation__leases_need_a_positive_ttl(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, ttl: Any
) -> None:
    job = insert(engine, db_now)
    clients = engine.client_list()

    refused(lambda: engine.client_register(ClientRegisterParams(hostname="h", ttl=ttl)), "ttl")
    refused(lambda: engine.client_renew(ClientRenewParams(client_id=client_id, ttl=ttl)), "ttl")
    refused(lambda: engine.leader_attempt(LeaderParams(client_id=client_id, ttl=ttl)), "ttl")
    refused(lambda: engine.job_claim_by_id(JobClaimByIDParams(id=job.id, fence=0, ttl=ttl)), "ttl")

    assert engine.client_list() == clients
    assert engine.leader_get() is None
    assert Job.objects.get(id=job.id).state == "available"


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("fence", {"fence": -1}),
        ("fence", {"fence": "0"}),
        ("fence", {"fence": True}),
        ("no_wait", {"no_wait": 1}),
        ("no_wait", {"no_wait": "yes"}),
    ],
)
def test_validation__claim_by_id_refuses_a_bad_fence_or_wait_option(
    engine: BaseEngine, db_now: dt.datetime, field: str, fields: dict[str, Any]
) -> None:
    job = insert(engine, db_now)
    values: dict[str, Any] = {"id": job.id, "fence": 0, "ttl": HOUR, "now": db_now, **fields}

    refused(lambda: engine.job_claim_by_id(JobClaimByIDParams(**values)), field)

    assert Job.objects.get(id=job.id).state == "available"


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("step", {"step": None}),
        ("step", {"step": 3}),
        ("step", {"step": None, "keep_step": True}),
        ("step", {"step": "a\x00b"}),
        ("keep_step", {"keep_step": 1}),
        ("no_wait", {"no_wait": "no"}),
        ("fence", {"fence": -1}),
        ("attempt", {"attempt": -1}),
        ("attempt", {"attempt": 1.0}),
        ("cursor['when']", {"cursor": {"when": dt.datetime(2030, 1, 1)}}),
        ("cursor", {"cursor": {1: "non-string key"}}),
        ("cursor", {"cursor": float("nan")}),
        ("cursor", {"cursor": "a\x00b"}),
    ],
)
def test_validation__record_progress_refuses_what_would_not_read_back(
    engine: BaseEngine, db_now: dt.datetime, client_id: int, field: str, fields: dict[str, Any]
) -> None:
    job = running(engine, client_id, db_now)
    values: dict[str, Any] = {
        "id": job.id,
        "attempted_by": client_id,
        "fence": job.fence,
        "attempt": job.attempt,
        "step": "s",
        **fields,
    }

    refused(lambda: engine.job_record_progress(JobRecordProgressParams(**values)), field)

    assert Job.objects.get(id=job.id).progress is None


@pytest.mark.parametrize("step", ["", LONG, None])
def test_validation__a_step_name_is_1_to_255_characters(engine: BaseEngine, step: Any) -> None:
    claim = {"id": uuid.UUID(int=1), "attempted_by": 1, "fence": 1}

    refused(lambda: engine.job_step_get(JobStepGetParams(step=step, **claim)), "step")
    refused(
        lambda: engine.job_step_record(JobStepRecordParams(step=step, done=True, **claim)), "step"
    )


# -- names -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "with space", "default\n", "q" * 129])
def test_validation__queue_controls_refuse_a_malformed_name(
    engine: BaseEngine, client_id: int, name: str
) -> None:
    refused(lambda: engine.queue_pause(name), "name")
    refused(lambda: engine.queue_resume(name), "name")
    refused(lambda: engine.queue_get(name), "name")
    refused(lambda: engine.queue_set_limits(QueueLimits(name=name, global_limit=1)), "name")
    refused(lambda: engine.queue_ensure([name]), "names")
    refused(
        lambda: engine.job_claim(JobClaimParams(queue=name, client_id=client_id, limit=1)),
        "queue",
    )
    refused(lambda: engine.job_age(JobAgeParams(queue=name, after=HOUR)), "queue")

    assert Queue.objects.count() == 0


def test_validation__queue_ensure_refuses_a_bare_string(engine: BaseEngine) -> None:
    refused(lambda: engine.queue_ensure("default"), "names")


def test_validation__retry_ordering_key_needs_a_key(engine: BaseEngine) -> None:
    refused(
        lambda: engine.job_retry_ordering_key(
            JobRetryOrderingKeyParams(queue="default", ordering_key="")
        ),
        "ordering_key",
    )


@pytest.mark.parametrize("topic", ["", "pay.done\n", "pay..done", "pay.*"])
def test_validation__topics_are_refused_identically(engine: BaseEngine, topic: str) -> None:
    refused(lambda: engine.stream_append(StreamAppendParams(topic=topic)), "topic")
    refused(lambda: engine.message_publish(MessagePublishParams(topic=topic)), "topic")

    assert StreamEvent.objects.count() == 0
    assert Job.objects.count() == 0


def test_validation__notify_needs_a_channel(engine: BaseEngine) -> None:
    refused(lambda: engine.notify("", ["x"]), "channel")


def test_validation__an_id_a_live_job_holds_is_refused_naming_the_id(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    taken = insert(engine, db_now, "tests.first")

    def insert_taken() -> None:
        with transaction.atomic():  # the failed statement rolls back to here
            engine.job_insert_many(
                [
                    JobInsertParams(kind="tests.good"),
                    JobInsertParams(kind="tests.other", id=taken.id),
                ]
            )

    error = refused(insert_taken, "id")

    assert "already exists" in str(error)
    assert list(Job.objects.values_list("kind", flat=True)) == ["tests.first"]
