"""System checks for the ``HOPPER`` setting and the database it names."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import management
from django.core.checks import Error, Warning, register

from django_hopper.conf import DEFAULTS, hopper_settings
from django_hopper.validation import QUEUE_RE


@register("hopper")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:

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
        for name, conc in queues.items():
            if not isinstance(name, str) or not QUEUE_RE.fullmatch(name):
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
    errors += _check_numbers(user, DEFAULTS)
    return errors


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: Keys that must be a number of seconds greater than zero.
POSITIVE_SECONDS = (
    "POLL_INTERVAL",
    "CLIENT_TTL",
    "HEARTBEAT_INTERVAL",
    "LEADER_TTL",
    "SHUTDOWN_TIMEOUT",
    "MAINTENANCE_INTERVAL",
    # Retention reads 0 as "not set" and falls back to the default, so 0 is refused.
    "COMPLETED_RETENTION",
    "FAILED_RETENTION",
    "BACKOFF_MAX",
)
#: Keys that are a number >= 0, where 0 has a meaning (said in the hint).
NON_NEGATIVE_NUMBERS = {
    "RESCUE_STUCK_AFTER": "seconds; 0 turns the rescue of stuck jobs off",
    "JOB_TIMEOUT": "seconds; 0 means no timeout",
    "UNKNOWN_KIND_GRACE": "seconds a job of an unknown kind is retried; 0 discards it at once",
    "COMPLETER_FLUSH_INTERVAL": "seconds; 0 writes each result at once",
    "CLAIM_DEBOUNCE": "seconds between wake-up claims of a queue; 0 claims on every wake-up",
    "STREAM_RETENTION": "seconds; 0 keeps stream events forever",
    "BACKOFF_BASE": "seconds multiplied by attempt ** BACKOFF_EXPONENT",
    "BACKOFF_EXPONENT": "the power of the attempt number in the backoff",
}
#: Keys that must be an integer of at least the given value.
INTEGERS = {
    "KEEP_LOGS": (0, "attempt logs kept per job; 0 keeps them all"),
    "COMPLETER_BATCH_SIZE": (1, "results written per batch"),
    "STREAM_PUMP_LIMIT": (1, "events per stream consumer per maintenance round"),
    "DEFAULT_MAX_ATTEMPTS": (1, "attempts of a job that does not say otherwise"),
    "ADMISSION_MISS_MAX": (1, "consecutive claims of a resumable run that did not begin"),
}


def _check_numbers(user: dict[str, Any], defaults: dict[str, Any]) -> list[Any]:
    """Check the numeric keys, so that a typo fails ``manage.py check``, not a worker later."""
    errors: list[Any] = []
    for key in POSITIVE_SECONDS:
        value = user.get(key, defaults[key])
        if not _is_number(value) or value <= 0:
            errors.append(
                Error(
                    f"HOPPER[{key!r}] must be a positive number of seconds, not {value!r}.",
                    hint="Give a number of seconds, e.g. 1.0.",
                    id="hopper.E008",
                )
            )
    for key, meaning in NON_NEGATIVE_NUMBERS.items():
        value = user.get(key, defaults[key])
        if not _is_number(value) or value < 0:
            errors.append(
                Error(
                    f"HOPPER[{key!r}] must be a number >= 0, not {value!r}.",
                    hint=f"Give a number ({meaning}).",
                    id="hopper.E009",
                )
            )
    for key, (least, meaning) in INTEGERS.items():
        value = user.get(key, defaults[key])
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            errors.append(
                Error(
                    f"HOPPER[{key!r}] must be an integer >= {least}, not {value!r}.",
                    hint=f"Give an integer ({meaning}).",
                    id="hopper.E010",
                )
            )
    ahead = user.get("CLAIM_AHEAD", defaults["CLAIM_AHEAD"])
    if ahead is not None and (not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 0):
        errors.append(
            Error(
                f"HOPPER['CLAIM_AHEAD'] must be None or an integer >= 0, not {ahead!r}.",
                hint=(
                    "It is how many jobs a queue's worker may claim beyond its free slots "
                    "while its jobs are short: None (the default) claims up to four times the "
                    "queue's concurrency ahead (at least 100 minus it), 0 turns it off."
                ),
                id="hopper.E018",
            )
        )
    margin = user.get("PASS_LEASE_MARGIN", defaults["PASS_LEASE_MARGIN"])
    if not _is_number(margin) or not 0 <= margin < 1:
        errors.append(
            Error(
                f"HOPPER['PASS_LEASE_MARGIN'] must be a fraction >= 0 and below 1, not {margin!r}.",
                hint=(
                    "It is the share of its lease a pass must still have left to begin; "
                    "0.25 (the default) refuses a pass whose lease expires within a quarter."
                ),
                id="hopper.E130",
            )
        )
    jitter = user.get("BACKOFF_JITTER", defaults["BACKOFF_JITTER"])
    if not _is_number(jitter) or not 0 <= jitter <= 1:
        errors.append(
            Error(
                f"HOPPER['BACKOFF_JITTER'] must be a fraction between 0 and 1, not {jitter!r}.",
                hint="0.1 spreads each retry delay by up to 10% either way; 0 turns jitter off.",
                id="hopper.E011",
            )
        )
    heartbeat = user.get("HEARTBEAT_INTERVAL", defaults["HEARTBEAT_INTERVAL"])
    ttl = user.get("CLIENT_TTL", defaults["CLIENT_TTL"])
    if _is_number(heartbeat) and _is_number(ttl) and 0 < ttl <= heartbeat:
        errors.append(
            Error(
                f"HOPPER['HEARTBEAT_INTERVAL'] ({heartbeat!r}) must be shorter than "
                f"HOPPER['CLIENT_TTL'] ({ttl!r}).",
                hint=(
                    "A lease renewed no more often than it expires lapses between renewals: "
                    "every worker would be fenced and its jobs rescued. Renew at least three "
                    "times per TTL, e.g. HEARTBEAT_INTERVAL 5 with CLIENT_TTL 30."
                ),
                id="hopper.E012",
            )
        )
    stuck = user.get("RESCUE_STUCK_AFTER", defaults["RESCUE_STUCK_AFTER"])
    timeout = user.get("JOB_TIMEOUT", defaults["JOB_TIMEOUT"])
    if _is_number(stuck) and _is_number(timeout) and 0 < stuck <= timeout:
        errors.append(
            Warning(
                f"HOPPER['RESCUE_STUCK_AFTER'] ({stuck!r}) is not longer than "
                f"HOPPER['JOB_TIMEOUT'] ({timeout!r}).",
                hint=(
                    "The rescue would end attempts as stuck before their own timeout does. "
                    "Make RESCUE_STUCK_AFTER longer than the longest job timeout."
                ),
                id="hopper.W002",
            )
        )
    for key in ("ARCHIVE_COMPLETED", "PREPARED_STATEMENTS"):
        value = user.get(key, defaults[key])
        if not isinstance(value, bool):
            errors.append(
                Error(
                    f"HOPPER[{key!r}] must be True or False, not {value!r}.",
                    hint="Give a boolean.",
                    id="hopper.E013",
                )
            )
    fmt = user.get("LOG_FORMAT", defaults["LOG_FORMAT"])
    if fmt not in ("text", "json"):
        errors.append(
            Error(
                f"HOPPER['LOG_FORMAT'] must be 'text' or 'json', not {fmt!r}.",
                hint="'json' writes one JSON object per line for log pipelines.",
                id="hopper.E015",
            )
        )
    for key, choices in (("TRACING", ()), ("METRICS", ("prometheus", "otel"))):
        value = user.get(key, defaults[key])
        if value is not None and not isinstance(value, bool) and value not in choices:
            named = "".join(f", {c!r}" for c in choices)
            errors.append(
                Error(
                    f"HOPPER[{key!r}] must be None, True, False{named}, not {value!r}.",
                    hint="None (the default) turns it on when its package is installed.",
                    id="hopper.E016",
                )
            )
    token = user.get("METRICS_TOKEN", defaults["METRICS_TOKEN"])
    if not isinstance(token, str):
        errors.append(
            Error(
                f"HOPPER['METRICS_TOKEN'] must be a string, not {type(token).__name__}.",
                hint="Read it from the environment, e.g. os.environ['HOPPER_METRICS_TOKEN'].",
                id="hopper.E017",
            )
        )
    imports = user.get("IMPORTS", defaults["IMPORTS"])
    if not isinstance(imports, list | tuple) or not all(isinstance(m, str) for m in imports):
        errors.append(
            Error(
                f"HOPPER['IMPORTS'] must be a list of module paths, not {imports!r}.",
                hint='For example ["myapp.jobs"].',
                id="hopper.E014",
            )
        )
    return errors


@register("hopper")
def check_migrate_command(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """Warn when another app's ``migrate`` shadows hopper's, which holds the migration lock.

    Django runs the ``migrate`` of the first installed app that ships one;
    without hopper's, two hosts migrating at once are not serialized.
    """
    owner = management.get_commands().get("migrate")
    if owner in ("django_hopper", None):
        return []
    return [
        Warning(
            f"manage.py migrate is {owner!r}'s, not django_hopper's: it does not hold "
            "hopper's migration lock, so two hosts migrating at once can half-apply the schema.",
            hint=(
                "List 'django_hopper' before that app in INSTALLED_APPS, or wrap the migrate "
                "your deploy runs in django_hopper.schema.migration_lock(alias)."
            ),
            id="hopper.W301",
        )
    ]
