"""System checks for the ``HOPPER`` setting and the database it names."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Warning, register


@register("hopper")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    from django.conf import settings

    from django_hopper.conf import DEFAULTS, hopper_settings

    errors: list[Any] = []
    user = getattr(settings, "HOPPER", None) or {}
    if not isinstance(user, dict):
        return [
            Error(
                "HOPPER must be a dict.", hint="Set HOPPER = {...} in settings.", id="hopper.E001"
            )
        ]
    for key in user:
        if key not in DEFAULTS:
            errors.append(
                Error(
                    f"HOPPER has an unknown key {key!r}.",
                    hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                    id="hopper.E002",
                )
            )
    alias = hopper_settings.DATABASE
    if alias not in settings.DATABASES:
        errors.append(
            Error(
                f"HOPPER['DATABASE'] names {alias!r}, which is not in DATABASES.",
                hint="Name one of the aliases in DATABASES.",
                id="hopper.E003",
            )
        )
    else:
        engine = settings.DATABASES[alias].get("ENGINE", "")
        if engine.endswith("sqlite3"):
            options = settings.DATABASES[alias].get("OPTIONS", {})
            if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
                errors.append(
                    Warning(
                        "hopper's SQLite database does not use IMMEDIATE transactions.",
                        hint=(
                            'Add "OPTIONS": {"transaction_mode": "IMMEDIATE", '
                            '"init_command": "PRAGMA journal_mode=WAL;"} so that several '
                            "worker processes do not fail with 'database is locked'."
                        ),
                        id="hopper.W001",
                    )
                )
        elif not (engine.endswith("postgresql") or "postgres" in engine):
            errors.append(
                Error(
                    f"hopper supports PostgreSQL and SQLite; {alias!r} uses {engine!r}.",
                    hint="Point HOPPER['DATABASE'] at a PostgreSQL or SQLite alias.",
                    id="hopper.E004",
                )
            )
    queues = user.get("QUEUES", DEFAULTS["QUEUES"])
    if not isinstance(queues, dict) or not queues:
        errors.append(
            Error(
                "HOPPER['QUEUES'] must map queue names to a concurrency.",
                hint='For example {"default": 10, "emails": 4}.',
                id="hopper.E005",
            )
        )
    else:
        from django_hopper.validation import QUEUE_RE

        for name, conc in queues.items():
            if not isinstance(name, str) or not QUEUE_RE.match(name):
                errors.append(
                    Error(
                        f"HOPPER['QUEUES'] has a malformed queue name {name!r}.",
                        hint="Use letters, digits, '_', '-', '.' and ':' (at most 128).",
                        id="hopper.E006",
                    )
                )
            if not isinstance(conc, int) or isinstance(conc, bool) or conc < 1:
                errors.append(
                    Error(
                        f"HOPPER['QUEUES'][{name!r}] must be a positive integer, not {conc!r}.",
                        hint="The concurrency is how many jobs of the queue a worker runs at once.",
                        id="hopper.E007",
                    )
                )
    for key in (
        "POLL_INTERVAL",
        "CLIENT_TTL",
        "HEARTBEAT_INTERVAL",
        "LEADER_TTL",
        "SHUTDOWN_TIMEOUT",
        "MAINTENANCE_INTERVAL",
    ):
        value = user.get(key, DEFAULTS[key])
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            errors.append(
                Error(
                    f"HOPPER[{key!r}] must be a positive number of seconds, not {value!r}.",
                    hint="Give a number of seconds, e.g. 1.0.",
                    id="hopper.E008",
                )
            )
    return errors
