"""schema_state, schema_check and schema_lock: the schema's version, the code floor,
the check workers run at start, the migration lock."""

from __future__ import annotations

import threading

import pytest
from django.db.migrations.recorder import MigrationRecorder

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import SchemaLockParams, SchemaState
from django_hopper.engine.rules import schema_mismatch
from django_hopper.exceptions import InvalidJob, SchemaMismatch
from django_hopper.models import SchemaFloor
from django_hopper.schema import code_version


def test_schema_state__reads_the_newest_applied_migration_and_no_floor(
    engine: BaseEngine,
) -> None:
    applied = MigrationRecorder(engine.connection).applied_migrations()
    newest = max(int(name[:4]) for app, name in applied if app == "django_hopper")

    state = engine.schema_state()

    assert state.version == newest == code_version()
    assert state.oldest_code == 0


def test_schema_state__the_floor_is_the_largest_code_version_declared(
    engine: BaseEngine,
) -> None:
    SchemaFloor.objects.create(code_version=3)
    SchemaFloor.objects.create(code_version=code_version() + 2)

    assert engine.schema_state().oldest_code == code_version() + 2


def test_schema_lock__a_second_taker_waits_until_the_first_releases(
    tx_engine: BaseEngine,
) -> None:
    told: list[str] = []
    waiting = threading.Event()
    inside = threading.Event()

    def on_wait(holder: str) -> None:
        told.append(holder)
        waiting.set()

    def second() -> None:
        with tx_engine.schema_lock(SchemaLockParams(poll_interval=0.01, on_wait=on_wait)):
            inside.set()

    with tx_engine.schema_lock(SchemaLockParams(poll_interval=0.01)):
        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        assert waiting.wait(30), "the second taker never found the lock held"
        assert not inside.is_set()
    thread.join(30)

    assert inside.is_set()
    assert len(told) == 1 and told[0]


def test_schema_lock__is_free_again_after_the_block(tx_engine: BaseEngine) -> None:
    with tx_engine.schema_lock(SchemaLockParams(poll_interval=0.01)):
        pass
    calls: list[str] = []

    with tx_engine.schema_lock(SchemaLockParams(poll_interval=0.01, on_wait=calls.append)):
        pass

    assert calls == []


def test_schema_lock__is_released_when_the_block_raises(tx_engine: BaseEngine) -> None:
    with (
        pytest.raises(RuntimeError),
        tx_engine.schema_lock(SchemaLockParams(poll_interval=0.01)),
    ):
        raise RuntimeError("boom")
    calls: list[str] = []

    with tx_engine.schema_lock(SchemaLockParams(poll_interval=0.01, on_wait=calls.append)):
        pass

    assert calls == []


@pytest.mark.parametrize("interval", [0, -1, float("nan"), "1", True])
def test_schema_lock__refuses_a_poll_interval_that_is_not_positive(
    engine: BaseEngine, interval: object
) -> None:
    params = SchemaLockParams(poll_interval=interval)  # type: ignore[arg-type]
    with pytest.raises(InvalidJob) as caught, engine.schema_lock(params):
        pass

    assert caught.value.field == "poll_interval"


def test_schema_check__passes_the_schema_this_code_is_built_for(engine: BaseEngine) -> None:
    assert engine.schema_check().version == code_version()


def test_schema_check__refuses_a_schema_that_no_longer_serves_this_code(
    engine: BaseEngine,
) -> None:
    SchemaFloor.objects.create(code_version=code_version() + 1)

    with pytest.raises(SchemaMismatch) as caught:
        engine.schema_check()

    assert caught.value.database == code_version()
    assert caught.value.code == code_version()
    assert f"needs code built for schema {code_version() + 1} or later" in str(caught.value)


@pytest.mark.parametrize(
    ("state", "words"),
    [
        (SchemaState(), ["has no hopper schema", "manage.py migrate django_hopper`"]),
        (
            SchemaState(version=5),
            ["has hopper schema 5", "built for schema 8", "manage.py migrate django_hopper`"],
        ),
        (SchemaState(version=7), ["has hopper schema 7", "built for schema 8"]),
        (SchemaState(version=12, oldest_code=9), ["schema 9 or later"]),
        (
            SchemaState(version=12, oldest_code=10),
            ["has hopper schema 12", "built for schema 8", "schema 10 or later"],
        ),
    ],
)
def test_schema_mismatch__names_both_versions_and_what_to_run(
    state: SchemaState, words: list[str]
) -> None:
    with pytest.raises(SchemaMismatch) as caught:
        schema_mismatch(state, 8, "default")

    for word in words:
        assert word in str(caught.value)


def test_schema_mismatch__names_the_database_to_migrate() -> None:
    with pytest.raises(SchemaMismatch, match=r"manage\.py migrate django_hopper --database busy"):
        schema_mismatch(SchemaState(version=5), 8, "busy")


@pytest.mark.parametrize("state", [SchemaState(version=8), SchemaState(version=11, oldest_code=8)])
def test_schema_mismatch__accepts_the_same_schema_or_one_ahead_that_serves_the_code(
    state: SchemaState,
) -> None:
    schema_mismatch(state, 8, "default")


def test_index_valid__is_true_for_a_built_index_and_none_for_a_missing_one(
    engine: BaseEngine,
) -> None:
    assert engine.index_valid("hopper_job_keyed") is True
    assert engine.index_valid("hopper_no_such_index") is None


@pytest.mark.parametrize("name", ["", None, "a\x00b"])
def test_index_valid__refuses_a_name_that_is_not_one(engine: BaseEngine, name: object) -> None:
    with pytest.raises(InvalidJob):
        engine.index_valid(name)  # type: ignore[arg-type]
