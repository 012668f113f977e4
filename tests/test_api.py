"""The public API: ``@job``, enqueue, ``resolve`` and the operator functions.

Runs on both engines (``HOPPER_TEST_DATABASE``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import pickle
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from django_hopper import api, signals
from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    ClientRegisterParams,
    JobClaimParams,
    JobFinalize,
    JobFinalizeParams,
    JobInsertResult,
)
from django_hopper.exceptions import (
    InvalidJob,
    JobRunning,
    NotFound,
    UniqueConflict,
    UnknownJobKind,
    UnknownQueue,
)
from django_hopper.jobs import (
    JobFunction,
    PreparedJob,
    aenqueue_many,
    enqueue_many,
    job,
    registry,
    resolve,
)
from django_hopper.models import Job, JobHistory
from django_hopper.types import JobRow
from tests.testapp import jobs as testjobs

ROOT = Path(__file__).resolve().parent.parent


def job_count() -> int:
    return Job.objects.count() + JobHistory.objects.count()


@pytest.fixture
def enqueued() -> Iterator[list[dict[str, Any]]]:
    """Collect every ``job_enqueued`` signal sent during the test."""
    calls: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        calls.append({"sender": sender, **kwargs})

    signals.job_enqueued.connect(receiver)
    yield calls
    signals.job_enqueued.disconnect(receiver)


def run_to(engine: BaseEngine, job_id: uuid.UUID, state: str, queue: str = "default") -> JobRow:
    """Claim a job and, unless ``state`` is running, finalize it in ``state``."""
    client = engine.client_register(
        ClientRegisterParams(hostname="test", ttl=dt.timedelta(minutes=5))
    )
    claimed = engine.job_claim(JobClaimParams(queue=queue, client_id=client, limit=10)).jobs
    row = next(j for j in claimed if j.id == job_id)
    if state != "running":
        engine.job_finalize_many(
            JobFinalizeParams(
                jobs=[JobFinalize(id=row.id, attempted_by=client, fence=row.fence, state=state)]
            )
        )
    return api.get_job(job_id)


# ---------------------------------------------------------------------------
# Decoration, kinds and resolve (no database)


def test_job__kind_is_the_functions_import_path() -> None:
    assert testjobs.add.kind == "tests.testapp.jobs.add"
    assert testjobs.send_email.kind == "tests.testapp.jobs.send_email"


def test_job__decorator_options_are_exposed_for_the_worker() -> None:
    f = testjobs.send_email
    assert isinstance(f, JobFunction)
    assert (f.queue, f.priority, f.max_attempts) == ("emails", 5, 3)
    assert f.timeout is None
    assert f.takes_context is False
    assert f.archive is None
    assert testjobs.with_context.takes_context is True
    assert testjobs.async_add.is_async is True
    assert testjobs.add.is_async is False


def test_job__plain_decorator_reads_queue_and_attempts_from_settings(settings: Any) -> None:
    settings.HOPPER = {**settings.HOPPER, "DEFAULT_QUEUE": "other", "DEFAULT_MAX_ATTEMPTS": 7}
    assert testjobs.add.queue == "other"
    assert testjobs.add.max_attempts == 7


def test_job__calling_the_function_runs_it_directly() -> None:
    assert testjobs.add(2, 3) == 5
    assert testjobs.add.__name__ == "add"
    assert testjobs.add.__doc__ and "sum" in testjobs.add.__doc__


def test_job__is_immutable_and_using_returns_a_copy() -> None:
    copy = testjobs.add.using(priority=10)
    assert copy is not testjobs.add
    assert copy.priority == 10
    assert testjobs.add.priority == 0
    with pytest.raises(AttributeError):
        testjobs.add.priority = 3  # type: ignore[misc]


def test_job__timeout_accepts_seconds_or_a_timedelta() -> None:
    a = job(timeout=2.5, kind="tests.test_api.timeout_a")(lambda: None)
    b = job(timeout=dt.timedelta(minutes=1), kind="tests.test_api.timeout_b")(lambda: None)
    assert (a.timeout, b.timeout) == (2.5, 60.0)
    with pytest.raises(InvalidJob) as err:
        job(timeout=0, kind="tests.test_api.timeout_c")(lambda: None)
    assert err.value.field == "timeout"


def test_job__refuses_a_local_function_without_an_explicit_kind() -> None:
    def local() -> None: ...

    with pytest.raises(InvalidJob, match="inside a function") as err:
        job(local)
    assert err.value.field == "kind"
    assert "tests.test_api.local" not in str(registry)


def test_job__refuses_a_function_defined_in_main() -> None:
    def f() -> None: ...

    f.__module__ = "__main__"
    f.__qualname__ = "f"
    with pytest.raises(InvalidJob, match="__main__"):
        job(f)


def test_job__local_function_with_explicit_kind_is_registered() -> None:
    def local() -> str:
        return "hi"

    jf = job(kind="tests.test_api.explicit_local")(local)
    assert resolve("tests.test_api.explicit_local") is jf


def test_job__refuses_a_second_function_under_a_taken_kind() -> None:
    with pytest.raises(InvalidJob, match="already registered"):
        job(kind=testjobs.add.kind)(lambda: None)
    assert registry[testjobs.add.kind] is testjobs.add


def test_job__refuses_bad_decorator_options() -> None:
    with pytest.raises(UnknownQueue):
        job(queue="", kind="tests.test_api.bad1")
    with pytest.raises(InvalidJob) as err:
        job(priority=101, kind="tests.test_api.bad2")
    assert err.value.field == "priority"
    with pytest.raises(InvalidJob) as err:
        job(max_attempts=0, kind="tests.test_api.bad3")
    assert err.value.field == "max_attempts"


def test_resolve__finds_a_registered_kind() -> None:
    assert resolve("tests.testapp.jobs.add") is testjobs.add


def test_resolve__imports_the_module_when_the_registry_lacks_the_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(registry, testjobs.add.kind)
    assert resolve("tests.testapp.jobs.add") is testjobs.add


@pytest.mark.parametrize(
    "kind",
    [
        "tests.testapp.jobs.no_such_job",  # module exists, attribute does not
        "no_such_package.module.func",  # module does not exist
        "tests.testapp.jobs.Any",  # attribute exists but is no job
        "nodots",
        "",
    ],
)
def test_resolve__unknown_kind_raises_naming_it(kind: str) -> None:
    with pytest.raises(UnknownJobKind) as err:
        resolve(kind)
    assert repr(kind) in str(err.value)


def test_job__pickles_by_kind() -> None:
    assert pickle.loads(pickle.dumps(testjobs.add)) is testjobs.add
    copy = pickle.loads(pickle.dumps(testjobs.add.using(priority=9, unique_key="k")))
    assert (copy.kind, copy.priority, copy.options.unique_key) == (testjobs.add.kind, 9, "k")


def test_import__django_hopper_and_job_need_no_settings_or_models() -> None:
    code = (
        "import sys, django_hopper\n"
        "from django_hopper import job\n"
        "assert 'django_hopper.models' not in sys.modules, 'models imported'\n"
        "assert 'django_hopper.engine' not in sys.modules, 'engine imported'\n"
        "print(job)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------------
# Enqueue and the caller's transaction


@pytest.mark.django_db(transaction=True)
def test_enqueue__commits_with_the_callers_transaction() -> None:
    with transaction.atomic():
        handle = testjobs.add.enqueue(1, b=2)
    row = api.get_job(handle.id)
    assert row.state == "available"
    assert row.kind == "tests.testapp.jobs.add"
    assert row.queue == "default"
    assert row.args == {"args": [1], "kwargs": {"b": 2}}
    assert Job.objects.filter(id=handle.id).exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue__rolls_back_with_the_callers_transaction() -> None:
    class Boom(Exception):
        pass

    handles = []
    with pytest.raises(Boom), transaction.atomic():
        handles.append(testjobs.add.enqueue(1, 2))
        assert api.get_job(handles[0].id).state == "available"  # visible inside
        raise Boom
    with pytest.raises(NotFound):
        api.get_job(handles[0].id)
    assert job_count() == 0


def test_enqueue__rolled_back_savepoint_leaves_no_job(db: None) -> None:
    kept = testjobs.add.enqueue(1, 2)
    try:
        with transaction.atomic():
            gone = testjobs.add.enqueue(3, 4)
            raise RuntimeError
    except RuntimeError:
        pass
    assert api.get_job(kept.id).state == "available"
    with pytest.raises(NotFound):
        api.get_job(gone.id)


def test_enqueue__handle_has_id_kind_row_and_refreshes(db: None) -> None:
    handle = testjobs.add.enqueue(1, 2)
    assert isinstance(handle.id, uuid.UUID)
    assert handle.kind == testjobs.add.kind
    assert handle.duplicate is False
    assert handle.job.id == handle.id
    assert handle.state == "available"
    api.cancel_job(handle.id)
    assert handle.state == "canceled"
    assert handle.job.state == "canceled"
    api.delete_job(handle.id)
    with pytest.raises(NotFound):
        handle.refresh()


def test_enqueue__handle_knows_its_id_and_kind_before_its_row_is_built(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens (observability off): no receiver asks for the row.
    monkeypatch.setattr(signals.job_enqueuing, "receivers", [])
    monkeypatch.setattr(signals.job_enqueued, "receivers", [])
    handle = testjobs.add.enqueue(1, 2)
    assert handle._job is None  # nothing read the row yet
    assert handle.kind == testjobs.add.kind
    stored = api.get_job(handle.id)
    assert handle._job is None
    assert handle.job == stored
    assert repr(handle) == f"<JobHandle {handle.kind} {handle.id} available>"


def test_insert_result__takes_a_row_or_a_way_to_build_it_and_reads_the_same() -> None:
    row = JobRow(
        id=uuid.uuid4(),
        kind="k",
        queue="q",
        state="available",
        priority=0,
        attempt=0,
        max_attempts=1,
        scheduled_at=timezone.now(),
        created_at=timezone.now(),
    )
    built: list[JobRow] = []

    def build() -> JobRow:
        built.append(row)
        return row

    lazy = JobInsertResult(build=build)
    assert built == []
    assert lazy == JobInsertResult(row) and lazy.job is row and lazy.job is row
    assert built == [row]
    with pytest.raises(TypeError):
        JobInsertResult()
    with pytest.raises(TypeError):
        JobInsertResult(row, build=build)


def test_enqueue__decorator_options_land_on_the_row(db: None) -> None:
    row = testjobs.send_email.enqueue("a@example.com", subject="hi").job
    assert (row.queue, row.priority, row.max_attempts) == ("emails", 5, 3)
    assert row.args == {"args": ["a@example.com"], "kwargs": {"subject": "hi"}}


def test_enqueue__using_options_land_on_the_row(db: None, db_now: dt.datetime) -> None:
    run_at = db_now + dt.timedelta(hours=1)
    handle = testjobs.add.using(
        queue="reports",
        priority=-7,
        max_attempts=2,
        run_after=run_at,
        unique_key="u-1",
        ordering_key="o-1",
        partition_key="p-1",
        tags=["a", "b", "a"],
        metadata={"tenant": 4, "nested": {"x": [1, 2]}},
        ttl=dt.timedelta(days=1),
    ).enqueue(1, 2)
    row = api.get_job(handle.id)
    assert row.queue == "reports"
    assert row.priority == -7
    assert row.max_attempts == 2
    assert row.state == "scheduled"
    assert abs(row.scheduled_at - run_at) < dt.timedelta(milliseconds=1)
    assert (row.unique_key, row.ordering_key, row.partition_key) == ("u-1", "o-1", "p-1")
    assert row.tags == ["a", "b"]
    assert row.metadata == {"tenant": 4, "nested": {"x": [1, 2]}}
    assert row.expires_at is not None
    assert (
        dt.timedelta(hours=23, minutes=59) < row.expires_at - row.created_at <= dt.timedelta(days=1)
    )


def test_enqueue__run_after_timedelta_schedules_from_now(db: None) -> None:
    before = timezone.now()
    row = testjobs.add.using(run_after=dt.timedelta(minutes=5)).enqueue(1, 2).job
    assert row.state == "scheduled"
    assert before + dt.timedelta(minutes=5) <= row.scheduled_at
    assert row.scheduled_at <= timezone.now() + dt.timedelta(minutes=5)


def test_enqueue__run_after_in_the_past_is_available_now(db: None) -> None:
    row = testjobs.add.using(run_after=timezone.now() - dt.timedelta(hours=1)).enqueue(1, 2).job
    assert row.state == "available"


def test_enqueue__tuples_are_stored_as_lists(db: None) -> None:
    row = testjobs.add.enqueue((1, 2), b={"k": (3,)}).job
    assert row.args == {"args": [[1, 2]], "kwargs": {"b": {"k": [3]}}}


def test_enqueue__sends_job_enqueued_with_the_rows(db: None, enqueued: list[Any]) -> None:
    handle = testjobs.add.enqueue(1, 2)
    assert len(enqueued) == 1
    assert enqueued[0]["sender"] is testjobs.add
    assert [j.id for j in enqueued[0]["jobs"]] == [handle.id]
    assert enqueued[0]["duplicates"] == []


def test_aenqueue__enqueues_from_async_code(db: None) -> None:
    handle = async_to_sync(testjobs.add.aenqueue)(5, 6)
    assert api.get_job(handle.id).args == {"args": [5, 6], "kwargs": {}}


# ---------------------------------------------------------------------------
# Unique keys


def test_enqueue__unique_key_returns_the_existing_job_as_duplicate(
    db: None, enqueued: list[Any]
) -> None:
    first = testjobs.add.using(unique_key="welcome-42").enqueue(1, 2)
    second = testjobs.add.using(unique_key="welcome-42").enqueue(3, 4)
    assert first.duplicate is False
    assert second.duplicate is True
    assert second.id == first.id
    assert api.get_job(first.id).args == {"args": [1, 2], "kwargs": {}}
    assert Job.objects.count() == 1
    assert enqueued[1]["jobs"] == []
    assert [j.id for j in enqueued[1]["duplicates"]] == [first.id]


def test_enqueue__unique_key_is_per_kind(db: None) -> None:
    a = testjobs.add.using(unique_key="same").enqueue(1, 2)
    b = testjobs.noop.using(unique_key="same").enqueue()
    assert not a.duplicate and not b.duplicate
    assert a.id != b.id


def test_enqueue__replace_updates_the_waiting_duplicate(db: None) -> None:
    first = testjobs.add.using(unique_key="r").enqueue(1, 2)
    second = testjobs.add.using(unique_key="r", replace=True, priority=9).enqueue(7, 8)
    assert second.duplicate is True
    assert second.id == first.id
    row = api.get_job(first.id)
    assert row.args == {"args": [7, 8], "kwargs": {}}
    assert row.priority == 9


def test_enqueue__unique_finished_makes_a_history_job_a_duplicate(db: None) -> None:
    first = testjobs.add.using(unique_key="f").enqueue(1, 2)
    api.cancel_job(first.id)
    again = testjobs.add.using(unique_key="f", unique_finished=["canceled"]).enqueue(1, 2)
    assert again.duplicate is True
    assert again.id == first.id
    fresh = testjobs.add.using(unique_key="f").enqueue(1, 2)
    assert fresh.duplicate is False


# ---------------------------------------------------------------------------
# enqueue_many


def test_enqueue_many__inserts_every_item_through_one_engine_call(
    db: None, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch, enqueued: list[Any]
) -> None:
    calls: list[int] = []
    for name in ("job_insert_many", "job_insert_copy"):
        original = getattr(engine, name)

        def spy(params: Any, opts: Any, _original: Any = original) -> Any:
            calls.append(len(params))
            return _original(params, opts)

        monkeypatch.setattr(engine, name, spy)
    handles = testjobs.add.enqueue_many([{"a": 1, "b": 2}, ((3,), {"b": 4}), ((5, 6), {})])
    assert calls == [3]
    rows = [api.get_job(h.id) for h in handles]
    assert [r.args for r in rows] == [
        {"args": [], "kwargs": {"a": 1, "b": 2}},
        {"args": [3], "kwargs": {"b": 4}},
        {"args": [5, 6], "kwargs": {}},
    ]
    assert len(enqueued) == 1 and len(enqueued[0]["jobs"]) == 3


def test_enqueue_many__runs_one_insert_statement(db: None, engine: BaseEngine) -> None:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    if engine.features.supports_copy:
        pytest.skip("COPY does not go through Django's cursor wrapper; see the engine-call test")
    with CaptureQueriesContext(connections[engine.alias]) as ctx:
        testjobs.add.enqueue_many([{"a": i, "b": i} for i in range(20)])
    inserts = [q for q in ctx.captured_queries if "insert" in q["sql"].lower()]
    assert len(inserts) == 1, [q["sql"][:80] for q in ctx.captured_queries]
    assert Job.objects.count() == 20


def test_enqueue_many__with_a_unique_key_inserts_the_first_only(db: None) -> None:
    handles = testjobs.add.using(unique_key="batch").enqueue_many([{"a": 1, "b": 1}] * 3)
    assert [h.duplicate for h in handles] == [False, True, True]
    assert len({h.id for h in handles}) == 1
    assert Job.objects.count() == 1


def test_enqueue_many__empty_batch_writes_nothing(db: None) -> None:
    assert testjobs.add.enqueue_many([]) == []
    assert job_count() == 0


def test_enqueue_many__one_invalid_item_writes_nothing(db: None) -> None:
    with pytest.raises(InvalidJob) as err:
        testjobs.add.enqueue_many([{"a": 1}, {"a": object()}, {"a": 3}])
    assert err.value.field == "items[1].kwargs['a']"
    assert job_count() == 0


def test_enqueue_many__refuses_a_malformed_item(db: None) -> None:
    with pytest.raises(InvalidJob) as err:
        testjobs.add.enqueue_many([{"a": 1}, [1, 2]])  # type: ignore[list-item]
    assert err.value.field == "items[1]"
    assert job_count() == 0


# ---------------------------------------------------------------------------
# Prepared jobs and django_hopper.enqueue_many: per-item kinds and options


def spy_inserts(engine: BaseEngine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str]]:
    """Record each engine insert call as (method, inputs, on_conflict)."""
    calls: list[tuple[str, int, str]] = []
    for name in ("job_insert_many", "job_insert_copy"):
        original = getattr(engine, name)

        def spy(params: Any, opts: Any, _original: Any = original, _name: str = name) -> Any:
            calls.append((_name, len(params), opts.on_conflict))
            return _original(params, opts)

        monkeypatch.setattr(engine, name, spy)
    return calls


def test_prepare__holds_the_function_and_the_json_form_of_its_arguments(db: None) -> None:
    kwargs: dict[str, Any] = {"b": (3, 4)}
    fn = testjobs.add.using(unique_key="p")
    prepared = fn.prepare(1, **kwargs)
    kwargs["b"] = "changed"
    assert isinstance(prepared, PreparedJob)
    assert prepared.function is fn
    assert prepared.args == (1,)
    assert dict(prepared.kwargs) == {"b": [3, 4]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.args = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        prepared.kwargs["b"] = 5  # type: ignore[index]
    again = pickle.loads(pickle.dumps(prepared))
    assert (again.function.options.unique_key, again.args, dict(again.kwargs)) == (
        "p",
        (1,),
        {"b": [3, 4]},
    )
    assert job_count() == 0


@pytest.mark.parametrize(
    ("make", "exc", "field"),
    [
        (lambda: testjobs.add.prepare(1, b=object()), InvalidJob, "kwargs['b']"),
        (lambda: testjobs.add.prepare(dt.date(2024, 1, 1), 2), InvalidJob, "args[0]"),
        (lambda: testjobs.add.using(unique_key="").prepare(1, 2), InvalidJob, "unique_key"),
        (lambda: testjobs.add.using(queue="has space").prepare(1, 2), UnknownQueue, "queue"),
        (lambda: PreparedJob(testjobs.add.func, (1, 2)), InvalidJob, "function"),  # type: ignore[arg-type]
    ],
)
def test_prepare__refuses_what_enqueue_refuses_naming_the_field(
    db: None, make: Any, exc: type[Exception], field: str
) -> None:
    with pytest.raises(exc) as err:
        make()
    assert isinstance(err.value, InvalidJob) and err.value.field == field
    assert job_count() == 0


def test_enqueue_many__per_item_unique_keys_return_duplicates_in_input_order(
    db: None, enqueued: list[Any]
) -> None:
    holder = testjobs.add.using(unique_key="u2").enqueue(0, 0)
    enqueued.clear()
    handles = enqueue_many(
        [
            testjobs.add.using(unique_key="u1").prepare(1, 1),
            testjobs.add.using(unique_key="u2").prepare(2, 2),
            testjobs.add.using(unique_key="u1").prepare(3, 3),
            testjobs.add.using(unique_key="u3").prepare(4, 4),
            testjobs.add.prepare(5, 5),
            testjobs.noop.using(unique_key="u1").prepare(),  # unique keys are per kind
        ]
    )
    assert [h.duplicate for h in handles] == [False, True, True, False, False, False]
    assert handles[1].id == holder.id
    assert handles[2].id == handles[0].id
    assert len({handles[i].id for i in (0, 1, 3, 4, 5)}) == 5
    assert api.get_job(handles[0].id).args == {"args": [1, 1], "kwargs": {}}
    assert api.get_job(holder.id).args == {"args": [0, 0], "kwargs": {}}
    assert Job.objects.count() == 5
    assert sum(len(call["jobs"]) for call in enqueued) == 4
    assert sum(len(call["duplicates"]) for call in enqueued) == 2


def test_enqueue_many__a_unique_finished_history_job_is_a_duplicate(db: None) -> None:
    done = testjobs.add.using(unique_key="f").enqueue(1, 2)
    api.cancel_job(done.id)
    handles = enqueue_many(
        [
            testjobs.add.using(unique_key="f", unique_finished=["canceled"]).prepare(3, 4),
            testjobs.add.using(unique_key="g", unique_finished=["canceled"]).prepare(5, 6),
        ]
    )
    assert [h.duplicate for h in handles] == [True, False]
    assert handles[0].id == done.id


def test_enqueue_many__mixes_kinds_and_per_item_options(db: None, db_now: dt.datetime) -> None:
    later = db_now + dt.timedelta(hours=1)
    handles = enqueue_many(
        [
            testjobs.add.using(priority=9, tags=["a"], metadata={"n": 1}).prepare(1, b=2),
            testjobs.send_email.using(
                run_after=later, ordering_key="o-1", partition_key="p-1", queue="reports"
            ).prepare("x@example.com", subject="hi"),
            testjobs.noop.using(ttl=dt.timedelta(minutes=5), max_attempts=2).prepare(),
        ]
    )
    rows = [api.get_job(h.id) for h in handles]
    assert [r.kind for r in rows] == [
        testjobs.add.kind,
        testjobs.send_email.kind,
        testjobs.noop.kind,
    ]
    assert (rows[0].priority, rows[0].tags, rows[0].metadata) == (9, ["a"], {"n": 1})
    assert rows[0].args == {"args": [1], "kwargs": {"b": 2}}
    assert (rows[1].queue, rows[1].priority, rows[1].state) == ("reports", 5, "scheduled")
    assert abs(rows[1].scheduled_at - later) < dt.timedelta(milliseconds=1)
    assert (rows[1].ordering_key, rows[1].partition_key) == ("o-1", "p-1")
    assert rows[2].max_attempts == 2 and rows[2].expires_at is not None


def test_enqueue_many__replace_items_update_their_holder_and_later_repeats_change_nothing(
    db: None,
) -> None:
    holder = testjobs.add.using(unique_key="r").enqueue(1, 2)
    handles = enqueue_many(
        [
            testjobs.add.using(unique_key="r", replace=True, priority=9).prepare(7, 8),
            testjobs.add.using(unique_key="r", replace=True, priority=1).prepare(0, 0),
            testjobs.add.using(unique_key="s").prepare(3, 4),
            testjobs.add.using(unique_key="t", replace=True).prepare(5, 6),
        ]
    )
    assert [h.duplicate for h in handles] == [True, True, False, False]
    assert handles[0].id == handles[1].id == holder.id
    row = api.get_job(holder.id)
    assert (row.args, row.priority) == ({"args": [7, 8], "kwargs": {}}, 9)
    assert Job.objects.count() == 3


def test_enqueue_many__copies_jobs_without_unique_keys_and_groups_the_rest_by_conflict_action(
    db: None, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = spy_inserts(engine, monkeypatch)
    handles = enqueue_many(
        [
            testjobs.add.prepare(1, 2),
            testjobs.add.using(unique_key="k1").prepare(1, 2),
            testjobs.noop.using(priority=3).prepare(),
            testjobs.add.using(unique_key="k2", replace=True).prepare(1, 2),
            testjobs.add.using(unique_key="k1").prepare(9, 9),
        ]
    )
    if engine.features.supports_copy:
        assert calls == [
            ("job_insert_copy", 2, "skip"),
            ("job_insert_many", 1, "skip"),
            ("job_insert_many", 1, "replace"),
        ]
    else:
        assert calls == [("job_insert_many", 3, "skip"), ("job_insert_many", 1, "replace")]
    written = [h.id for h in handles[:4]]
    assert written == sorted(written), "IDs follow input order across the groups"
    assert [h.duplicate for h in handles] == [False, False, False, False, True]


def test_enqueue_many__one_group_is_one_engine_call(
    db: None, engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = spy_inserts(engine, monkeypatch)
    enqueue_many([testjobs.add.using(unique_key=f"u{i}").prepare(i, i) for i in range(50)])
    enqueue_many([testjobs.add.using(priority=i % 10).prepare(i, i) for i in range(50)])
    method = "job_insert_copy" if engine.features.supports_copy else "job_insert_many"
    assert calls == [("job_insert_many", 50, "skip"), (method, 50, "skip")]
    assert Job.objects.count() == 100


def test_enqueue_many__one_invalid_item_writes_nothing_and_is_named(db: None) -> None:
    good = testjobs.add.prepare(1, 2)
    with pytest.raises(InvalidJob) as err:
        enqueue_many([good, testjobs.add, good])  # type: ignore[list-item]
    assert err.value.field == "items[1]"
    assert job_count() == 0


def test_enqueue_many__settings_changed_since_prepare_name_the_item(
    db: None, settings: Any
) -> None:
    items = [testjobs.add.using(queue="q").prepare(1, 2), testjobs.add.prepare(1, 2)]
    settings.HOPPER = {**settings.HOPPER, "DEFAULT_QUEUE": "has space"}
    with pytest.raises(UnknownQueue) as err:
        enqueue_many(items)
    assert err.value.field == "items[1].queue"
    assert job_count() == 0


def test_enqueue_many__empty_call_writes_nothing(db: None) -> None:
    assert enqueue_many([]) == []
    assert job_count() == 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_many__rolls_back_with_the_callers_transaction() -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        handles = enqueue_many(
            [
                testjobs.add.prepare(1, 2),
                testjobs.add.prepare(3, 4),
                testjobs.add.using(unique_key="k").prepare(5, 6),
                testjobs.add.using(unique_key="r", replace=True).prepare(7, 8),
            ]
        )
        assert api.get_job(handles[3].id).state == "available"
        raise Boom
    assert job_count() == 0


def test_enqueue_many__sends_job_enqueued_once_per_function(db: None, enqueued: list[Any]) -> None:
    emails = testjobs.send_email.using(tags=["x"])
    handles = enqueue_many(
        [
            testjobs.add.prepare(1, 2),
            emails.prepare("a@example.com"),
            testjobs.add.prepare(3, 4),
            emails.prepare("b@example.com"),
        ]
    )
    assert [(c["sender"], [j.id for j in c["jobs"]]) for c in enqueued] == [
        (testjobs.add, [handles[0].id, handles[2].id]),
        (emails, [handles[1].id, handles[3].id]),
    ]


def test_aenqueue_many__enqueues_prepared_jobs_from_async_code(db: None) -> None:
    handles = async_to_sync(aenqueue_many)(
        [testjobs.add.prepare(1, 2), testjobs.noop.using(unique_key="a").prepare()]
    )
    assert [api.get_job(h.id).kind for h in handles] == [testjobs.add.kind, testjobs.noop.kind]


def test_job_enqueue_many__takes_prepared_calls_of_its_kind_with_their_own_options(
    db: None,
) -> None:
    handles = testjobs.add.using(priority=2).enqueue_many(
        [
            {"a": 1, "b": 2},
            testjobs.add.using(unique_key="one", priority=7).prepare(3, 4),
            ((5,), {"b": 6}),
            testjobs.add.using(unique_key="one").prepare(0, 0),
        ]
    )
    rows = [api.get_job(h.id) for h in handles]
    assert [(r.priority, r.unique_key) for r in rows] == [
        (2, None),
        (7, "one"),
        (2, None),
        (7, "one"),
    ]
    assert [h.duplicate for h in handles] == [False, False, False, True]


def test_job_enqueue_many__refuses_a_prepared_call_of_another_kind(db: None) -> None:
    with pytest.raises(InvalidJob) as err:
        testjobs.add.enqueue_many([{"a": 1, "b": 2}, testjobs.noop.prepare()])
    assert err.value.field == "items[1]"
    assert job_count() == 0


def test_aenqueue_many__takes_prepared_calls_too(db: None) -> None:
    handles = async_to_sync(testjobs.add.aenqueue_many)([testjobs.add.prepare(1, 2)])
    assert api.get_job(handles[0].id).args == {"args": [1, 2], "kwargs": {}}


# ---------------------------------------------------------------------------
# Validation: each error names the field and writes nothing


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        ((dt.datetime(2024, 1, 1, tzinfo=dt.UTC),), {}, "args[0]"),
        ((), {"when": dt.date(2024, 1, 1)}, "kwargs['when']"),
        ((), {"obj": object()}, "kwargs['obj']"),
        (({1, 2},), {}, "args[0]"),
        ((), {"nested": {"deep": [1, uuid.uuid4()]}}, "kwargs['nested']['deep'][1]"),
        ((float("nan"),), {}, "args[0]"),
        (({1: "int key"},), {}, "args[0]"),
        ((b"bytes",), {}, "args[0]"),
        (("a\x00b",), {}, "args[0]"),
        ((), {"nested": {"k\x00": 1}}, "kwargs['nested']"),
        # A lone surrogate has no UTF-8 form: PostgreSQL's jsonb refuses it.
        (("a\udcffb",), {}, "args[0]"),
        ((), {"nested": {"k\ud800": 1}}, "kwargs['nested']"),
    ],
)
def test_enqueue__refuses_args_that_are_not_json(
    db: None, args: tuple[Any, ...], kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidJob) as err:
        testjobs.add.enqueue(*args, **kwargs)
    assert err.value.field == field
    assert job_count() == 0


@pytest.mark.parametrize(
    ("options", "exc", "field"),
    [
        ({"queue": ""}, UnknownQueue, "queue"),
        ({"queue": "has space"}, UnknownQueue, "queue"),
        ({"queue": "x" * 129}, UnknownQueue, "queue"),
        ({"queue": None}, UnknownQueue, "queue"),
        ({"priority": 101}, InvalidJob, "priority"),
        ({"priority": -101}, InvalidJob, "priority"),
        ({"priority": 1.5}, InvalidJob, "priority"),
        ({"max_attempts": 0}, InvalidJob, "max_attempts"),
        ({"run_after": dt.datetime(2030, 1, 1)}, InvalidJob, "run_after"),
        ({"run_after": "tomorrow"}, InvalidJob, "run_after"),
        ({"ttl": dt.timedelta(0)}, InvalidJob, "ttl"),
        ({"ttl": -5}, InvalidJob, "ttl"),
        ({"unique_key": ""}, InvalidJob, "unique_key"),
        ({"ordering_key": "k" * 256}, InvalidJob, "ordering_key"),
        ({"tags": "one-string"}, InvalidJob, "tags"),
        ({"tags": ["ok", ""]}, InvalidJob, "tags"),
        ({"metadata": ["not", "a", "dict"]}, InvalidJob, "metadata"),
        ({"metadata": {"when": dt.date(2024, 1, 1)}}, InvalidJob, "metadata['when']"),
        ({"unique_finished": ["running"]}, InvalidJob, "unique_finished"),
        ({"replace": "yes"}, InvalidJob, "replace"),
    ],
)
def test_using__refuses_invalid_options_naming_the_field(
    db: None, options: dict[str, Any], exc: type[Exception], field: str
) -> None:
    with pytest.raises(exc) as err:
        testjobs.add.using(**options).enqueue(1, 2)
    assert isinstance(err.value, ValueError)
    assert isinstance(err.value, InvalidJob) and err.value.field == field
    assert job_count() == 0


# ---------------------------------------------------------------------------
# Operator functions


def test_get_job__accepts_a_uuid_or_its_string(db: None) -> None:
    handle = testjobs.add.enqueue(1, 2)
    assert api.get_job(handle.id).id == handle.id
    assert api.get_job(str(handle.id)).id == handle.id


@pytest.mark.parametrize("func", [api.get_job, api.cancel_job, api.retry_job, api.delete_job])
def test_api__malformed_id_raises_invalid_job_naming_job_id(db: None, func: Any) -> None:
    with pytest.raises(InvalidJob) as err:
        func("not-a-uuid")
    assert err.value.field == "job_id"
    with pytest.raises(InvalidJob):
        func(12345)


@pytest.mark.parametrize("func", [api.get_job, api.cancel_job, api.retry_job, api.delete_job])
def test_api__unknown_id_raises_not_found(db: None, func: Any) -> None:
    with pytest.raises(NotFound):
        func(uuid.uuid4())


def test_cancel_job__moves_a_waiting_job_to_history(db: None) -> None:
    handle = testjobs.add.enqueue(1, 2)
    row = api.cancel_job(str(handle.id))
    assert row.state == "canceled"
    assert row.finalized_at is not None
    assert not Job.objects.filter(id=handle.id).exists()
    assert JobHistory.objects.filter(id=handle.id, state="canceled").exists()


def test_cancel_job__requests_cancel_of_a_running_job(db: None, engine: BaseEngine) -> None:
    handle = testjobs.add.enqueue(1, 2)
    run_to(engine, handle.id, "running")
    row = api.cancel_job(handle.id)
    assert row.state == "running"
    assert row.cancel_requested_at is not None


def test_retry_job__brings_a_discarded_job_back_to_live(db: None, engine: BaseEngine) -> None:
    handle = testjobs.add.using(max_attempts=1).enqueue(1, 2)
    assert run_to(engine, handle.id, "discarded").state == "discarded"
    row = api.retry_job(handle.id)
    assert row.state == "available"
    assert row.finalized_at is None
    assert row.max_attempts == 2  # one more attempt, as it had used them all
    assert Job.objects.filter(id=handle.id).exists()
    assert not JobHistory.objects.filter(id=handle.id).exists()


def test_retry_job__brings_a_scheduled_job_forward(db: None) -> None:
    handle = testjobs.add.using(run_after=dt.timedelta(hours=1)).enqueue(1, 2)
    assert handle.state == "scheduled"
    row = api.retry_job(handle.id)
    assert row.state == "available"
    assert row.scheduled_at <= timezone.now() + dt.timedelta(seconds=1)


def test_retry_job__refuses_a_running_job(db: None, engine: BaseEngine) -> None:
    handle = testjobs.add.enqueue(1, 2)
    run_to(engine, handle.id, "running")
    with pytest.raises(JobRunning):
        api.retry_job(handle.id)


def test_retry_job__refuses_when_a_live_job_holds_the_unique_key(db: None) -> None:
    first = testjobs.add.using(unique_key="k").enqueue(1, 2)
    api.cancel_job(first.id)
    testjobs.add.using(unique_key="k").enqueue(3, 4)
    with pytest.raises(UniqueConflict):
        api.retry_job(first.id)
    assert api.get_job(first.id).state == "canceled"


def test_delete_job__removes_a_waiting_job_and_returns_it(db: None) -> None:
    handle = testjobs.add.enqueue(1, 2)
    row = api.delete_job(handle.id)
    assert row.id == handle.id
    with pytest.raises(NotFound):
        api.get_job(handle.id)
    assert job_count() == 0


def test_delete_job__removes_a_history_job(db: None) -> None:
    handle = testjobs.add.enqueue(1, 2)
    api.cancel_job(handle.id)
    api.delete_job(handle.id)
    assert job_count() == 0


def test_delete_job__refuses_a_running_job(db: None, engine: BaseEngine) -> None:
    handle = testjobs.add.enqueue(1, 2)
    run_to(engine, handle.id, "running")
    with pytest.raises(JobRunning):
        api.delete_job(handle.id)
    assert api.get_job(handle.id).state == "running"


def test_list_jobs__filters_by_kind_state_and_queue(db: None) -> None:
    a = testjobs.add.enqueue(1, 2)
    b = testjobs.noop.enqueue()
    c = testjobs.send_email.enqueue("x@example.com")
    api.cancel_job(b.id)
    assert [j.id for j in api.list_jobs()] == [a.id, b.id, c.id]
    assert [j.id for j in api.list_jobs(newest_first=True)] == [c.id, b.id, a.id]
    assert [j.id for j in api.list_jobs(kinds=testjobs.add.kind)] == [a.id]
    assert [j.id for j in api.list_jobs(states=["canceled"])] == [b.id]
    assert [j.id for j in api.list_jobs(queue="emails")] == [c.id]
    assert [j.id for j in api.list_jobs(after=a.id, limit=1)] == [b.id]
    assert [j.id for j in api.list_jobs(ids=[str(c.id)])] == [c.id]


def test_list_jobs__filters_by_tags_and_metadata(db: None) -> None:
    a = testjobs.add.using(tags=["x", "y"], metadata={"tenant": 1, "k": "v"}).enqueue(1, 2)
    b = testjobs.add.using(tags=["y"], metadata={"tenant": 2}).enqueue(1, 2)
    assert [j.id for j in api.list_jobs(tags_all=["x", "y"])] == [a.id]
    assert [j.id for j in api.list_jobs(tags_any="y")] == [a.id, b.id]
    assert [j.id for j in api.list_jobs(metadata={"tenant": 2})] == [b.id]


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"states": ["nope"]}, "states"),
        ({"limit": -1}, "limit"),
        ({"ordering_key": "k"}, "ordering_key"),
        ({"after": "bad"}, "after"),
        ({"queue": ""}, "queue"),
    ],
)
def test_list_jobs__refuses_invalid_filters(db: None, filters: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJob) as err:
        api.list_jobs(**filters)
    assert err.value.field == field


def test_job_logs__is_empty_for_a_job_that_never_ran(db: None) -> None:
    handle = testjobs.add.enqueue(1, 2)
    assert api.job_logs(str(handle.id)) == []


def test_public_names__are_exported_lazily_from_the_package() -> None:
    import django_hopper

    assert django_hopper.job is job
    assert django_hopper.get_job is api.get_job
    assert django_hopper.JobFunction is JobFunction
    assert django_hopper.enqueue_many is enqueue_many
    assert django_hopper.aenqueue_many is aenqueue_many
    assert django_hopper.PreparedJob is PreparedJob
    with pytest.raises(AttributeError):
        django_hopper.no_such_name  # noqa: B018
