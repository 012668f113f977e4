"""Both engines name the same queries, and every query is named after an engine method.

A name may be missing from one engine only where docs/engine-semantics.md says
that engine runs no SQL for it, because it lacks the capability
(``EngineFeatures``) or, for ``now``, because SQLite is embedded and its clock is
the machine's.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from django.utils.module_loading import import_string

from django_hopper.engine import ENGINES
from django_hopper.engine import base as engine_base
from django_hopper.engine.base import BaseEngine, EngineFeatures, Listener
from django_hopper.engine.queries import COL, JOB_COLUMNS, JOB_WIDTH, base_names, load, parse

VENDORS = sorted(ENGINES)

#: Query names an engine needs only if it has the capability.
CAPABILITY_QUERIES: dict[str, set[str]] = {
    "supports_copy": {"job_insert_copy"},
    "supports_listen": {"notify", "listener", "listener_listen"},
}
#: Engines whose "database now" is the process clock (docs/engine-semantics.md).
EMBEDDED_CLOCK_QUERIES = {"now"}


def engine_class(vendor: str) -> type[BaseEngine]:
    return import_string(ENGINES[vendor])


def engine_dir(vendor: str) -> str:
    return str(Path(inspect.getfile(engine_class(vendor))).resolve().parent)


def query_names(vendor: str) -> set[str]:
    return base_names(load(engine_dir(vendor)))


def optional_names(features: EngineFeatures) -> set[str]:
    """Names an engine with ``features`` may leave out."""
    names = set(EMBEDDED_CLOCK_QUERIES) if features.single_writer else set()
    for flag, gated in CAPABILITY_QUERIES.items():
        if not getattr(features, flag):
            names |= gated
    return names


def contract_classes() -> list[type]:
    """BaseEngine and the other method contracts of ``engine/base.py`` (engines gain
    those through mixins); not Listener, the params and row dataclasses, or constants."""
    return [
        obj
        for obj in vars(engine_base).values()
        if inspect.isclass(obj)
        and obj.__module__ == engine_base.__name__
        and not dataclasses.is_dataclass(obj)
        and obj is not Listener
    ]


def method_names(cls: type) -> set[str]:
    return {
        name
        for klass in cls.__mro__
        for name, member in vars(klass).items()
        if not name.startswith("_") and callable(member)
    }


def test_queries__both_engines_define_the_same_query_names() -> None:
    names = {vendor: query_names(vendor) for vendor in VENDORS}
    for vendor in VENDORS:
        required = set().union(*names.values()) - optional_names(engine_class(vendor).features)
        assert sorted(required - names[vendor]) == [], f"queries the {vendor} engine lacks"


@pytest.mark.parametrize("vendor", VENDORS)
def test_queries__every_query_name_is_an_engine_method(vendor: str) -> None:
    methods = method_names(engine_class(vendor))
    for contract in contract_classes():
        methods |= method_names(contract)
    methods |= {f"listener_{name}" for name in method_names(Listener)}

    assert sorted(query_names(vendor) - methods) == []


@pytest.mark.parametrize("vendor", VENDORS)
def test_queries__each_engine_keeps_its_sql_in_query_files(vendor: str) -> None:
    queries = load(engine_dir(vendor))

    assert {"job_insert_many", "job_claim", "job_finalize_many"} <= base_names(queries)
    assert all(sql.strip() for sql in queries.values()), "an empty query"


# ---------------------------------------------------------------------------
# The load-time substitution pass (engine/queries.py)


@pytest.mark.parametrize("vendor", VENDORS)
def test_queries__leave_no_template_syntax_in_what_the_server_sees(vendor: str) -> None:
    for name, sql in load(engine_dir(vendor)).items():
        assert "{job_" not in sql and "{no_history}" not in sql, name
        assert "/*IF" not in sql and "/*ELSE*/" not in sql and "/*END*/" not in sql, name


def test_queries__job_columns_expand_in_one_order_with_the_alias_on_every_column() -> None:
    queries = parse(
        "-- fragment: no_history\nNULL AS finalized_at, NULL AS output\n"
        "-- name: a\nSELECT {job_columns:j} FROM hopper_job j\n"
        "-- name: b\nSELECT {job_columns_history:h} FROM hopper_job_history h\n"
        "-- name: c\nINSERT INTO hopper_job ({job_columns_live}) VALUES (1)\n"
        "-- name: d\nPRAGMA busy_timeout = {ms}\n"
    )

    live = ", ".join(f"j.{c}" for c in JOB_COLUMNS[:-2])
    assert queries["a"] == f"SELECT {live}, NULL AS finalized_at, NULL AS output FROM hopper_job j"
    assert queries["b"].split(" FROM ")[0] == "SELECT " + ", ".join(f"h.{c}" for c in JOB_COLUMNS)
    assert queries["c"].startswith("INSERT INTO hopper_job (id, kind, queue, ")
    assert queries["d"] == "PRAGMA busy_timeout = {ms}", "a brace word that names no fragment"


def test_queries__a_variant_keeps_the_sections_of_its_flags_and_the_base_the_others() -> None:
    queries = parse(
        "-- name: job_list\n"
        "-- variant: job_list.newest_first NEWEST_FIRST\n"
        "SELECT id FROM t WHERE id /*IF NEWEST_FIRST*/</*ELSE*/>/*END*/ %(after)s\n"
        "ORDER BY id/*IF NEWEST_FIRST*/ DESC/*END*/\n"
    )

    assert queries["job_list"] == "SELECT id FROM t WHERE id > %(after)s\nORDER BY id"
    assert queries["job_list.newest_first"] == (
        "SELECT id FROM t WHERE id < %(after)s\nORDER BY id DESC"
    )


@pytest.mark.parametrize(
    "text",
    [
        "-- name: q\n-- variant: q.v FLAG\nSELECT 1 /*IF FALG*/+ 1/*END*/\n",
        "-- name: q\n-- variant: q.v FLAG\nSELECT 1\n",
        "-- name: q\nSELECT 1 /*IF FLAG*/+ 1/*END*/\n",
        "-- name: q\n-- variant: other.v FLAG\nSELECT 1 /*IF FLAG*/+ 1/*END*/\n",
        "-- name: q\nSELECT {job_columns:j}\n",
        "-- fragment: no_history\nNULL\n-- fragment: no_history\nNULL\n",
    ],
    ids=["misspelt", "untested", "undeclared", "misnamed", "no_history_missing", "twice"],
)
def test_queries__refuse_a_template_mistake_at_load(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)


def test_queries__name_every_column_of_a_job_row_once() -> None:
    assert len(set(JOB_COLUMNS)) == JOB_WIDTH
    assert [getattr(COL, name) for name in JOB_COLUMNS] == list(range(JOB_WIDTH))
    assert JOB_COLUMNS[-5:] == ("step", "subject", "erased_at", "finalized_at", "output")


def test_queries__a_fragment_may_use_other_fragments_but_not_itself() -> None:
    queries = parse(
        "-- fragment: inner\nx = 1\n"
        "-- fragment: outer\nWHERE {inner} AND {job_columns_live:j} IS NOT NULL\n"
        "-- name: q\nSELECT 1 FROM t {outer}\n"
    )

    assert queries["q"].startswith("SELECT 1 FROM t WHERE x = 1 AND j.id, j.kind")
    with pytest.raises(ValueError, match="nest"):
        parse("-- fragment: loop\n{loop}\n-- name: q\nSELECT {loop}\n")
