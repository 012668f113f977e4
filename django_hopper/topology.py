"""Where hopper's databases are and how they are reached.

Three settings describe a production topology, each keyed by Django database
alias or queue name, so that one description covers one database or several:

- ``HOPPER["QUEUE_DATABASES"]``: queue -> alias, for queues that live on another
  database than ``HOPPER["DATABASE"]`` (a busy queue on its own PostgreSQL).
  Enqueue writes a job through the alias of its queue, so it joins that alias's
  transaction; a worker serves the queues of one alias (``--database``).
- ``HOPPER["POOLERS"]``: alias -> ``"transaction"`` or ``"session"``, for an alias
  reached through a connection pooler (PgBouncer). Through a transaction
  pooler a session lasts one transaction: hopper prepares no statements there
  (a statement prepared on one server connection is unknown on the next) and
  opens no session of its own through it.
- ``HOPPER["DIRECT_DATABASES"]``: alias -> alias of a direct connection (no
  pooler, or a session pooler) to the same database. What needs a session goes
  there: the LISTEN connection and the leader's maintenance (advisory locks,
  session settings, ``CREATE INDEX CONCURRENTLY``, ``VACUUM``). An alias behind a
  transaction pooler without one has no notifications: its workers poll.

The rules are written here once; the engine and the worker ask these functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from django_hopper.conf import hopper_settings
from django_hopper.exceptions import InvalidJob

#: The pool modes hopper knows how to work through.
POOLER_MODES = ("session", "transaction")


def queue_alias(queue: str) -> str:
    """Return the database alias the queue's jobs live on."""
    placed: dict[str, str] = hopper_settings.QUEUE_DATABASES
    return placed.get(queue) or str(hopper_settings.DATABASE)


def aliases() -> list[str]:
    """Return every alias hopper's jobs live on, ``HOPPER["DATABASE"]`` first."""
    main = str(hopper_settings.DATABASE)
    others = sorted(set(hopper_settings.QUEUE_DATABASES.values()) - {main})
    return [main, *others]


def single_alias(queues: Iterable[str], what: str) -> str:
    """Return the one alias every queue of ``queues`` lives on, for what is written at once.

    A batch or a workflow is one atomic write whose jobs, dependencies and
    callbacks refer to each other: it cannot span databases (there is no
    transaction across them). Raises InvalidJob naming the queues of each
    alias when they differ.
    """
    by_alias: dict[str, set[str]] = {}
    for queue in queues:
        by_alias.setdefault(queue_alias(queue), set()).add(queue)
    if len(by_alias) > 1:
        where = "; ".join(
            f"{', '.join(repr(q) for q in sorted(qs))} on {alias!r}"
            for alias, qs in sorted(by_alias.items())
        )
        raise InvalidJob(
            f"{what} must live on one database (HOPPER['QUEUE_DATABASES']): its queues "
            f"are {where}; use queues of one alias, or enqueue the parts separately",
            field="queue",
        )
    return next(iter(by_alias), str(hopper_settings.DATABASE))


def queues_of(alias: str, queues: dict[str, int]) -> dict[str, int]:
    """Return the queues of ``queues`` that live on ``alias``."""
    return {q: c for q, c in queues.items() if queue_alias(q) == alias}


def pooler(alias: str) -> str | None:
    """Return the pool mode of the pooler in front of ``alias``, or None for none."""
    poolers: dict[str, str] = hopper_settings.POOLERS
    return poolers.get(alias)


def prepares(alias: str) -> bool:
    """Return whether the hot statements on ``alias`` run as server-side prepared statements.

    Not through a transaction pooler: each transaction may land on another
    server connection, where the statement psycopg prepared is unknown, or is
    another client's statement of the same name.
    """
    return bool(hopper_settings.PREPARED_STATEMENTS) and pooler(alias) != "transaction"


def session_alias(alias: str) -> str | None:
    """Return the alias for work that needs a session on ``alias``'s database, or None.

    The direct connection when one is configured; the alias itself unless a
    transaction pooler sits in front of it; otherwise None (no session: poll).
    """
    direct: dict[str, str] = hopper_settings.DIRECT_DATABASES
    if alias in direct:
        return direct[alias]
    return None if pooler(alias) == "transaction" else alias


def maintenance_alias(alias: str) -> str:
    """Return the alias the leader's maintenance of ``alias`` runs through.

    The direct connection when there is one (its passes set session settings
    and take advisory locks); else the alias itself.
    """
    return session_alias(alias) or alias


def describe(alias: str) -> str:
    """Return how ``alias`` is reached and woken, for a worker's start line."""
    if _vendor(alias) != "postgresql":
        return f"database {alias!r}: polling every {hopper_settings.POLL_INTERVAL}s"
    mode = pooler(alias)
    route = f"through a {mode} pooler" if mode else "direct"
    statements = "prepared statements" if prepares(alias) else "no prepared statements"
    listen = session_alias(alias)
    if listen is None:
        wake = f"polling every {hopper_settings.POLL_INTERVAL}s (no DIRECT_DATABASES entry)"
    elif listen == alias:
        wake = "LISTEN"
    else:
        wake = f"LISTEN through {listen!r}"
    return f"database {alias!r}: {route}, {statements}, {wake}"


# -- system checks --------------------------------------------------------------


def _vendor(alias: str) -> str:

    engine = str(settings.DATABASES[alias].get("ENGINE", ""))
    if "postgres" in engine:
        return "postgresql"
    if engine.endswith("sqlite3"):
        return "sqlite"
    return engine


@register("hopper")
def check_topology(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Check QUEUE_DATABASES, POOLERS and DIRECT_DATABASES against DATABASES."""

    user = getattr(settings, "HOPPER", None) or {}
    if not isinstance(user, dict):
        return []  # hopper.E001 says so
    errors: list[Any] = []
    databases = settings.DATABASES
    placed = user.get("QUEUE_DATABASES", {})
    if not isinstance(placed, dict):
        errors.append(_mapping_error("QUEUE_DATABASES", placed, '{"emails": "mail_db"}'))
    else:
        for queue, alias in placed.items():
            if alias not in databases or _vendor(alias) not in ("postgresql", "sqlite"):
                errors.append(
                    Error(
                        f"HOPPER['QUEUE_DATABASES'][{queue!r}] names {alias!r}, "
                        "which is not a PostgreSQL or SQLite alias in DATABASES.",
                        hint="Place the queue on one of the aliases in DATABASES.",
                        id="hopper.E201",
                    )
                )
    poolers = user.get("POOLERS", {})
    if not isinstance(poolers, dict):
        errors.append(_mapping_error("POOLERS", poolers, '{"default": "transaction"}'))
        poolers = {}
    for alias, mode in poolers.items():
        if alias not in databases or _vendor(alias) != "postgresql" or mode not in POOLER_MODES:
            errors.append(
                Error(
                    f"HOPPER['POOLERS'][{alias!r}] = {mode!r}: the key must be a PostgreSQL "
                    "alias in DATABASES and the value 'transaction' or 'session'.",
                    hint="Give the pool mode of the PgBouncer the alias connects to.",
                    id="hopper.E202",
                )
            )
    direct = user.get("DIRECT_DATABASES", {})
    if not isinstance(direct, dict):
        errors.append(_mapping_error("DIRECT_DATABASES", direct, '{"default": "direct"}'))
        direct = {}
    for alias, target in direct.items():
        ok = (
            alias in databases
            and target in databases
            and _vendor(alias) == "postgresql"
            and _vendor(target) == "postgresql"
            and poolers.get(target) != "transaction"
        )
        if not ok:
            errors.append(
                Error(
                    f"HOPPER['DIRECT_DATABASES'][{alias!r}] = {target!r}: both must be "
                    "PostgreSQL aliases in DATABASES, and the target not behind a "
                    "transaction pooler.",
                    hint="Name an alias that connects to the same database without PgBouncer.",
                    id="hopper.E203",
                )
            )
    for alias, mode in poolers.items():
        if mode == "transaction" and alias not in direct:
            errors.append(
                Warning(
                    f"Database {alias!r} is behind a transaction pooler and has no "
                    "direct connection: its workers poll instead of listening.",
                    hint=(
                        f"Add HOPPER['DIRECT_DATABASES'] = {{{alias!r}: 'direct'}} with a "
                        "'direct' alias that bypasses PgBouncer, for LISTEN and maintenance."
                    ),
                    id="hopper.W201",
                )
            )
    return errors


def _mapping_error(key: str, value: Any, example: str) -> Error:
    return Error(
        f"HOPPER[{key!r}] must be a dict, not {value!r}.",
        hint=f"For example {example}.",
        id="hopper.E200",
    )


def undeclared_proxy(alias: str) -> str | None:
    """Return a warning when ``alias`` reaches PostgreSQL through a proxy POOLERS does not name.

    A proxy shows as a server port other than the one the client dialled.
    PgBouncer does not say its pool mode to a client, so this can tell that
    one is there, not whether it pools transactions: the setting decides.
    """
    if pooler(alias) is not None or _vendor(alias) != "postgresql":
        return None
    from django_hopper.engine import get_engine  # noqa: PLC0415 - import cycle: the engine imports topology
    from django_hopper.engine.postgres.base import PostgresEngine  # noqa: PLC0415 - import cycle: the postgres engine imports topology

    engine = get_engine(alias)
    assert isinstance(engine, PostgresEngine)
    route = engine.connection_route()
    if not route.proxied:
        return None
    return (
        f"database {alias!r} is reached through a proxy ({route}) and "
        "HOPPER['POOLERS'] does not say its pool mode: behind PgBouncer in transaction "
        f"mode set HOPPER['POOLERS'] = {{{alias!r}: 'transaction'}}, else 'session'"
    )


@register(Tags.database)
def check_pooler_detected(databases: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when an alias reaches PostgreSQL through a proxy that POOLERS does not name.

    Runs with ``check --database`` (and ``migrate``): it connects.
    """
    warnings: list[Any] = []
    for alias in databases or []:
        if alias not in aliases():
            continue
        message = undeclared_proxy(alias)
        if message is not None:
            warnings.append(
                Warning(
                    message[0].upper() + message[1:] + ".",
                    hint=(
                        "Through a transaction pooler hopper must prepare no statements and "
                        "LISTEN over a direct connection (HOPPER['DIRECT_DATABASES'])."
                    ),
                    id="hopper.W202",
                )
            )
    return warnings
