"""The topology settings: QUEUE_DATABASES, POOLERS and DIRECT_DATABASES, their
checks, and the rules the engine and the worker read from them."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_hopper import topology
from tests.topology.conftest import POSTGRES, requires_postgres

BASE: dict[str, Any] = {"QUEUES": {"default": 10}}


def messages(**hopper: Any) -> dict[str, Any]:
    with override_settings(HOPPER={**BASE, **hopper}):
        return {m.id: m for m in run_checks(tags=["hopper"])}


@pytest.mark.parametrize(
    ("hopper", "check_id"),
    [
        ({"QUEUE_DATABASES": ["busy"]}, "hopper.E200"),
        ({"QUEUE_DATABASES": {"busy": "nowhere"}}, "hopper.E201"),
        ({"POOLERS": "transaction"}, "hopper.E200"),
        ({"POOLERS": {"nowhere": "transaction"}}, "hopper.E202"),
        ({"POOLERS": {"default": "statement"}}, "hopper.E202"),
        ({"DIRECT_DATABASES": {"default": "nowhere"}}, "hopper.E203"),
        ({"DIRECT_DATABASES": "direct"}, "hopper.E200"),
    ],
)
def test_checks__a_bad_topology_setting_names_the_key(hopper: dict[str, Any], check_id: str):
    found = messages(**hopper)
    assert check_id in found
    assert next(iter(hopper)) in found[check_id].msg


def test_checks__the_queue_databases_may_name_any_alias_of_a_supported_engine():
    found = messages(QUEUE_DATABASES={"busy": "default"})
    assert not [m for m in found if m.startswith("hopper.E")]


@requires_postgres
def test_checks__a_transaction_pooler_without_a_direct_connection_warns_of_polling():
    found = messages(POOLERS={"default": "transaction"})
    assert "hopper.W201" in found
    assert "poll" in found["hopper.W201"].msg
    assert not [m for m in found if m.startswith("hopper.E")]


@pytest.mark.skipif(POSTGRES, reason="SQLite has no pooler")
def test_checks__a_pooler_in_front_of_sqlite_is_refused():
    assert "hopper.E202" in messages(POOLERS={"default": "session"})


def test_queue_alias__a_placed_queue_lives_on_its_alias_the_others_on_database():
    with override_settings(HOPPER={**BASE, "QUEUE_DATABASES": {"busy": "busy_db"}}):
        assert topology.queue_alias("busy") == "busy_db"
        assert topology.queue_alias("emails") == "default"
        assert topology.aliases() == ["default", "busy_db"]
        assert topology.queues_of("default", {"busy": 2, "emails": 3}) == {"emails": 3}


def test_prepares__not_through_a_transaction_pooler():
    with override_settings(HOPPER={**BASE, "POOLERS": {"default": "transaction"}}):
        assert not topology.prepares("default")
    with override_settings(HOPPER={**BASE, "POOLERS": {"default": "session"}}):
        assert topology.prepares("default")
    with override_settings(HOPPER={**BASE, "PREPARED_STATEMENTS": False}):
        assert not topology.prepares("default")


def test_session_alias__the_direct_connection_else_none_behind_a_transaction_pooler():
    with override_settings(HOPPER={**BASE, "POOLERS": {"default": "transaction"}}):
        assert topology.session_alias("default") is None
        assert topology.maintenance_alias("default") == "default"
    with override_settings(
        HOPPER={
            **BASE,
            "POOLERS": {"default": "transaction"},
            "DIRECT_DATABASES": {"default": "direct"},
        }
    ):
        assert topology.session_alias("default") == "direct"
        assert topology.maintenance_alias("default") == "direct"
    with override_settings(HOPPER={**BASE, "POOLERS": {"default": "session"}}):
        assert topology.session_alias("default") == "default"


@requires_postgres
def test_prepared_cursor__none_through_a_transaction_pooler(engine):
    with override_settings(HOPPER={**BASE, "POOLERS": {"default": "transaction"}}):
        assert engine._prepared_cursor() is None
    with override_settings(HOPPER={**BASE, "POOLERS": {"default": "session"}}):
        assert engine._prepared_cursor() is not None


@requires_postgres
def test_listener__refused_behind_a_transaction_pooler_without_a_direct_connection(engine):
    from django_hopper.exceptions import NotSupported

    with (
        override_settings(HOPPER={**BASE, "POOLERS": {"default": "transaction"}}),
        pytest.raises(NotSupported, match="DIRECT_DATABASES"),
    ):
        engine.listener()


@requires_postgres
def test_connection_route__proxied_exactly_when_the_alias_goes_through_a_bouncer(engine):
    # The bouncer pass (scripts/test) points "default" at a PgBouncer.
    assert engine.connection_route().proxied is bool(os.environ.get("HOPPER_TEST_PGBOUNCER_PORT"))
