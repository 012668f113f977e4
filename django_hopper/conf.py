"""The ``HOPPER`` setting, read lazily (never at import time) and validated by
system checks (:mod:`django_hopper.checks`).

Every key has a default, so a project that sets nothing gets a working queue:
jobs go to the ``default`` queue and the worker works it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # The database alias hopper's tables live on and jobs are enqueued through.
    "DATABASE": "default",
    # Queues a worker works when started without --queues: name -> concurrency.
    "QUEUES": {"default": 10},
    # Defaults for jobs that do not say otherwise.
    "DEFAULT_QUEUE": "default",
    "DEFAULT_MAX_ATTEMPTS": 25,
    # Seconds between polls when no notification arrives.
    "POLL_INTERVAL": 1.0,
    # A wake-up (an insert notification) closer than this many seconds to the
    # queue's previous claim waits for the rest of it: the first job into an
    # idle queue is claimed at once, a burst of inserts costs one claim per
    # interval instead of one per job. 0 claims on every wake-up.
    "CLAIM_DEBOUNCE": 0.005,
    # Jobs a queue's worker may claim beyond its free slots while its jobs are
    # short, to start them from a local buffer the moment a slot frees (None:
    # four times the queue's concurrency, and at least enough that a full claim
    # carries 100 jobs; 0 turns it off). Never on a queue with limits,
    # never a job with an ordering key; a worker that dies holding them has each
    # counted as an admission miss, not an attempt (docs/queue-controls.md).
    "CLAIM_AHEAD": None,
    # Client lease: its time to live and how often it is renewed (seconds).
    "CLIENT_TTL": 30.0,
    "HEARTBEAT_INTERVAL": 5.0,
    # Leader lease time to live (seconds) and maintenance loop interval.
    "LEADER_TTL": 15.0,
    "MAINTENANCE_INTERVAL": 1.0,
    # Running jobs claimed longer ago than this are rescued even if their client
    # lives (seconds; 0 disables).
    "RESCUE_STUCK_AFTER": 3600.0,
    # Seconds a stopping worker waits for running jobs before leaving them to the rescue.
    "SHUTDOWN_TIMEOUT": 30.0,
    # Per-job timeout in seconds (0: none); @job(timeout=...) overrides it.
    "JOB_TIMEOUT": 0.0,
    # Completer: flush after this many results or this many seconds.
    "COMPLETER_BATCH_SIZE": 500,
    "COMPLETER_FLUSH_INTERVAL": 0.005,
    # Attempt logs kept per job (the latest); 0 keeps them all.
    "KEEP_LOGS": 10,
    # Write completed jobs to history (canceled and discarded always are).
    "ARCHIVE_COMPLETED": True,
    # History retention (seconds).
    "COMPLETED_RETENTION": 7 * 24 * 3600.0,
    "FAILED_RETENTION": 30 * 24 * 3600.0,
    # Stream events are kept this long (seconds; 0 keeps them forever), and the
    # leader turns at most STREAM_PUMP_LIMIT events per consumer into jobs a round.
    "STREAM_RETENTION": 7 * 24 * 3600.0,
    "STREAM_PUMP_LIMIT": 1000,
    # Retry backoff: attempt ** BACKOFF_EXPONENT seconds, capped, with jitter.
    "BACKOFF_BASE": 1.0,
    "BACKOFF_EXPONENT": 4.0,
    "BACKOFF_MAX": 24 * 3600.0,
    "BACKOFF_JITTER": 0.1,
    # A job whose kind a worker does not know is snoozed (1 s, 2 s, 4 s ... at
    # most 60 s apart, its attempt given back) until it is this old (seconds
    # from enqueue), so that a worker of the new release runs it during a
    # rolling deploy; then it is discarded with the reason. 0 discards at once.
    "UNKNOWN_KIND_GRACE": 900.0,
    # Resumable runs (docs/resumable.md). The share of its lease a claimed pass
    # must still have left to BEGIN: a pass whose lease expires sooner does not
    # start its work (an admission miss, which costs no attempt).
    "PASS_LEASE_MARGIN": 0.25,
    # Consecutive admission misses after which a run fails ("lease too short for
    # this environment") instead of being claimed again.
    "ADMISSION_MISS_MAX": 10,
    # Modules imported by the worker so that their @job functions register.
    "IMPORTS": [],
    # Periodic jobs declared in settings.
    "PERIODIC": [],
    # PostgreSQL: run the hot statements (insert, claim, finalize) as server-side
    # prepared statements, planned once per connection. Set False behind
    # PgBouncer in transaction mode before 1.21 (no prepared statement support);
    # HOPPER["POOLERS"] turns them off for the aliases behind such a pooler.
    "PREPARED_STATEMENTS": True,
    # Several databases and poolers (django_hopper.topology, docs/deploying.md).
    # Queues living on another alias than DATABASE: queue -> alias.
    "QUEUE_DATABASES": {},
    # Aliases reached through a connection pooler: alias -> "transaction" or
    # "session". Through a transaction pooler hopper prepares no statements.
    "POOLERS": {},
    # alias -> alias of a direct connection to the same database, for LISTEN and
    # the leader's maintenance (they need a session a transaction pooler lacks).
    "DIRECT_DATABASES": {},
    # The worker's console lines: "text" (one line per record) or "json" (one
    # JSON object per line, for log pipelines); --log-format overrides it.
    "LOG_FORMAT": "text",
    # OpenTelemetry tracing of enqueue and execution (django-hopper[otel]):
    # None turns it on when opentelemetry-api is installed, False turns it off.
    "TRACING": None,
    # Job metrics and their one exporter per process: "prometheus", "otel",
    # False for none; None (or True) takes OpenTelemetry when an SDK
    # MeterProvider is configured, else Prometheus when prometheus-client is
    # installed, else OpenTelemetry's API.
    "METRICS": None,
    # A bearer token that lets a scraper read the metrics view without a staff
    # session ("" accepts staff sessions only).
    "METRICS_TOKEN": "",
}


#: ``LazySettings``' own cache of the settings read through it: Django stores a
#: setting there on its first read and drops it when the setting is assigned or
#: deleted, or the wrapped settings are replaced (``override_settings``).
_LAZY_CACHE: dict[str, Any] = object.__getattribute__(settings, "__dict__")
_MISSING = object()


def _hopper() -> Any:
    """Return ``settings.HOPPER`` (None when unset), read now.

    From the lazy settings' cache when Django holds it there, else through
    ``settings`` (which caches it): the same value, without ``LazyObject``'s
    Python-level ``__getattribute__`` and the ``getattr`` inside it that raises
    on every read.
    """
    value = _LAZY_CACHE.get("HOPPER", _MISSING)
    if value is _MISSING:
        value = getattr(settings, "HOPPER", None)
    return value


def _reader(name: str) -> property:
    """Return a property that reads the ``name`` key of ``settings.HOPPER`` or its default.

    A property rather than ``__getattr__`` alone: ``__getattr__`` runs only
    after the normal lookup has failed and built an ``AttributeError``, and
    the worker reads two settings per job.
    """
    default = DEFAULTS[name]

    def read(self: HopperSettings) -> Any:
        value = _hopper()
        return value.get(name, default) if value else default

    return property(read, doc=f"``HOPPER[{name!r}]``, read on each access.")


class HopperSettings:
    """Attribute access to ``settings.HOPPER`` with defaults, read on each access.

    Each key of :data:`DEFAULTS` is a property (set below the class); a name
    that is not one raises ``AttributeError``.
    """

    def _user(self) -> dict[str, Any]:

        value = _hopper() or {}
        return dict(value)

    def __getattr__(self, name: str) -> Any:
        # Reached only for a name that is not a setting's property.
        raise AttributeError(f"HOPPER has no setting {name!r}")

    def seconds(self, name: str) -> dt.timedelta:
        """Return a setting given in seconds as a timedelta."""
        return dt.timedelta(seconds=float(getattr(self, name)))

    def as_dict(self) -> dict[str, Any]:
        out = dict(DEFAULTS)
        out.update(self._user())
        return out


for _name in DEFAULTS:
    setattr(HopperSettings, _name, _reader(_name))

hopper_settings = HopperSettings()
