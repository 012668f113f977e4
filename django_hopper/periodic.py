"""Periodic jobs: declarations, schedules, slots and the catch-up policy.

Declare a periodic job in code, above ``@job``::

    @periodic(cron="*/5 * * * *", tz="Europe/Paris")
    @job(queue="reports")
    def refresh_dashboard() -> None: ...

    @periodic(every=dt.timedelta(seconds=30), name="heartbeat")
    @job
    def ping() -> None: ...

or in settings, ``HOPPER["PERIODIC"] = [{"job": "app.jobs.cleanup", "cron": "0 3 * * *",
"tz": "Europe/Paris"}]`` (``every`` in seconds there).

Every rule lives here, once, in Python: how a cron expression (in its time
zone, through ``cronsim``) or an interval (aligned to the Unix epoch) yields
slots, which slot is due after an outage (:func:`due_slot`), and what job a
slot inserts (:meth:`PeriodicDefinition.job_params`). The engine only records
that a slot was inserted, atomically, so a slot produces at most one job
across leaders; the leader's :class:`~django_hopper.maintenance.PeriodicEnqueuer`
calls these functions.

A definition travels as JSON (``to_json``): each client registers its own
(``periodic_register``, with a sha256 digest of the canonical JSON), and the
leader schedules from the registrations of live clients, so a leader running
older code still inserts what the newest clients declared.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.core.checks import Error, register

from django_hopper import validation
from django_hopper.conf import hopper_settings
from django_hopper.engine import get_engine
from django_hopper.engine.params import (
    JobInsertParams,
    PeriodicDisableParams,
    PeriodicEnableParams,
    PeriodicRegistration,
    PeriodicRunNowParams,
    PeriodicRunNowResult,
)
from django_hopper.exceptions import InvalidJob, NotFound
from django_hopper.jobs import JobFunction, kind_of, registry
from django_hopper.types import PeriodicSlotRow

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.engine.params import JobInsertParams, PeriodicRegistration

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
CatchUp = Literal["once", "skip"]
CATCH_UP_POLICIES: tuple[str, ...] = ("once", "skip")
#: A slot counts as on time while it is less than this old (leader latency).
DEFAULT_GRACE = dt.timedelta(seconds=60)
_NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,255}")
#: The keys a HOPPER["PERIODIC"] entry may have.
SETTING_KEYS = frozenset(
    {
        "job", "name", "cron", "every", "tz", "args", "kwargs", "catch_up", "grace",
        "queue", "priority", "max_attempts", "tags", "metadata", "ttl",
    }
)  # fmt: skip

J = TypeVar("J")


class InvalidPeriodic(InvalidJob):
    """A periodic declaration is invalid (bad cron spec, time zone, interval ...)."""


# ---------------------------------------------------------------------------
# Schedules and slots


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a periodic job is due: a cron expression in a time zone, or an interval.

    Slots are instants (aware UTC datetimes). An interval's slots are the
    multiples of ``every`` since the Unix epoch, so every client computes the
    same ones whatever its start time.
    """

    cron: str | None = None
    every: dt.timedelta | None = None
    tz: str = "UTC"

    @classmethod
    def parse(cls, cron: str | None, every: Any, tz: str | None) -> Schedule:
        """Check a schedule and return it; raise InvalidPeriodic naming what is wrong."""
        tz = tz or "UTC"
        if not isinstance(tz, str):
            raise InvalidPeriodic(f"tz must be a time zone name, not {tz!r}", field="tz")
        try:
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidPeriodic(f"unknown time zone {tz!r}", field="tz") from None
        if (cron is None) == (every is None):
            raise InvalidPeriodic("give exactly one of cron and every", field="cron")
        if cron is not None:
            if not isinstance(cron, str):
                raise InvalidPeriodic(f"cron must be a string, not {cron!r}", field="cron")
            try:
                CronSim(cron, dt.datetime(2000, 1, 1, tzinfo=zone))
            except (CronSimError, ValueError, KeyError, IndexError) as exc:
                raise InvalidPeriodic(
                    f"bad cron spec {cron!r}: {exc or 'cannot be parsed'} "
                    "(expected 5 fields, e.g. '*/5 * * * *', or 6 with seconds first)",
                    field="cron",
                ) from None
            return cls(cron=" ".join(cron.split()), tz=tz)
        try:
            interval = validation.positive_duration(every, "every")
        except InvalidJob as exc:
            raise InvalidPeriodic(str(exc), field="every") from None
        return cls(every=interval, tz=tz)

    def latest_at_or_before(self, when: dt.datetime) -> dt.datetime:
        """Return the latest slot at or before ``when``."""
        if self.every is not None:
            step = _micros(self.every)
            return EPOCH + dt.timedelta(microseconds=(_micros(when - EPOCH) // step) * step)
        assert self.cron is not None
        # cronsim walks backwards from strictly before its start: start one
        # second after ``when`` floored to the second (slots are whole seconds).
        start = when.astimezone(ZoneInfo(self.tz)).replace(microsecond=0) + dt.timedelta(seconds=1)
        return next(CronSim(self.cron, start, reverse=True)).astimezone(UTC)

    def next_after(self, when: dt.datetime) -> dt.datetime:
        """Return the first slot strictly after ``when``."""
        if self.every is not None:
            return self.latest_at_or_before(when) + self.every
        assert self.cron is not None
        return next(CronSim(self.cron, when.astimezone(ZoneInfo(self.tz)))).astimezone(UTC)


def _micros(value: dt.timedelta) -> int:
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def due_slot(
    schedule: Schedule,
    *,
    last_slot: dt.datetime | None,
    now: dt.datetime,
    catch_up: str = "once",
    grace: dt.timedelta = DEFAULT_GRACE,
) -> dt.datetime | None:
    """Return the slot to insert at ``now``, or None: the one scheduling rule.

    The candidate is the latest slot at or before ``now``; nothing is due if
    it was already inserted (``last_slot`` at or after it). A candidate less
    than ``grace`` old is on time and always due. An older one means slots
    were missed (an outage, no leader): with ``catch_up="once"`` the latest
    missed slot is inserted, once, for all of them; with ``"skip"`` the missed
    slots are skipped and the job waits for its next slot. A job never
    inserted before (``last_slot`` None) does not catch up: it starts with
    its first slot on time, so deploying a daily job at noon does not run it
    at once for the slot of 3 a.m.
    """
    candidate = schedule.latest_at_or_before(now)
    if last_slot is not None and candidate <= last_slot:
        return None
    if now - candidate < grace:
        return candidate
    if catch_up == "once" and last_slot is not None:
        return candidate
    return None


# ---------------------------------------------------------------------------
# Definitions


@dataclass(frozen=True, slots=True)
class PeriodicDefinition:
    """One periodic job: what to insert and when. Build it with :func:`register_periodic`."""

    name: str
    kind: str
    schedule: Schedule
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    catch_up: str = "once"
    grace: dt.timedelta = DEFAULT_GRACE
    #: Job options; None takes the job function's (or HOPPER's) default when
    #: the definition is registered (to_json).
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    ttl: dt.timedelta | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the definition as registered: complete, so any leader can insert from it.

        Options left to defaults are resolved here, from the ``@job``
        function if this process knows it and from ``HOPPER`` otherwise.
        """

        queue, priority, max_attempts = self.queue, self.priority, self.max_attempts
        job_function = _job_function(self.kind)
        if job_function is not None:
            queue = queue if queue is not None else job_function.queue
            priority = priority if priority is not None else job_function.priority
            max_attempts = max_attempts if max_attempts is not None else job_function.max_attempts
        return {
            "name": self.name,
            "kind": self.kind,
            "cron": self.schedule.cron,
            "every": self.schedule.every.total_seconds() if self.schedule.every else None,
            "tz": self.schedule.tz,
            "catch_up": self.catch_up,
            "grace": self.grace.total_seconds(),
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "queue": queue if queue is not None else hopper_settings.DEFAULT_QUEUE,
            "priority": priority if priority is not None else 0,
            "max_attempts": (
                max_attempts if max_attempts is not None else hopper_settings.DEFAULT_MAX_ATTEMPTS
            ),
            "tags": list(self.tags),
            "metadata": dict(self.metadata),
            "ttl": self.ttl.total_seconds() if self.ttl else None,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PeriodicDefinition:
        """Rebuild (and check) a definition from its JSON, as a leader reads a registration."""
        return _build(dict(obj), source="registration")

    def registration(self) -> PeriodicRegistration:
        """Return the engine registration of this definition (JSON and digest)."""

        definition = self.to_json()
        return PeriodicRegistration(
            name=self.name, definition=definition, digest=digest(definition)
        )


def digest(definition: Mapping[str, Any]) -> str:
    """Return the sha256 of a definition's canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_params(definition: Mapping[str, Any], name: str, slot: dt.datetime) -> JobInsertParams:
    """Return the job a slot inserts, from a registered definition's JSON.

    The job runs at once (the slot is due); its metadata names the periodic
    job and the slot, so listings and the admin can tell where it came from.
    """

    ttl = definition.get("ttl")
    return JobInsertParams(
        kind=definition["kind"],
        queue=definition["queue"],
        priority=int(definition["priority"]),
        max_attempts=int(definition["max_attempts"]),
        args={
            "args": list(definition.get("args") or []),
            "kwargs": dict(definition.get("kwargs") or {}),
        },
        metadata={
            **dict(definition.get("metadata") or {}),
            "periodic": name,
            "slot": slot.astimezone(UTC).isoformat(),
        },
        tags=tuple(definition.get("tags") or ()),
        ttl=dt.timedelta(seconds=ttl) if ttl else None,
    )


#: The unique key of a periodic job's run now: a second run now while the first
#: waits or runs returns the first.
RUN_NOW_KEY = "hopper.periodic.run_now:{name}"


def run_now_params(definition: Mapping[str, Any], name: str, at: dt.datetime) -> JobInsertParams:
    """Return the job of a run now outside the schedule: the slot's job, marked
    ``run_now`` instead of ``slot``, with the run now's unique key."""
    job = job_params(definition, name, at)
    metadata = {k: v for k, v in job.metadata.items() if k != "slot"}
    metadata["run_now"] = at.astimezone(UTC).isoformat()
    return dataclasses.replace(job, metadata=metadata, unique_key=RUN_NOW_KEY.format(name=name))


def _job_function(kind: str) -> Any:
    """Return the ``@job`` function of a kind if this process has it registered."""

    return registry.get(kind)


def _build(obj: dict[str, Any], *, source: str) -> PeriodicDefinition:
    """Check every field of a definition given as a dict and return it."""
    unknown = set(obj) - SETTING_KEYS - {"kind"}
    if unknown:
        raise InvalidPeriodic(
            f"{source} has unknown keys {sorted(unknown)}; known: {sorted(SETTING_KEYS)}",
            field=sorted(unknown)[0],
        )
    kind = obj.get("kind") or obj.get("job")
    if not isinstance(kind, str) or not kind:
        raise InvalidPeriodic(f"{source} needs 'job', the job's kind (import path)", field="job")
    name = obj.get("name") or kind
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidPeriodic(
            f"periodic name {name!r} is malformed: use letters, digits, '_', '-', '.' and ':'",
            field="name",
        )
    schedule = Schedule.parse(obj.get("cron"), obj.get("every"), obj.get("tz"))
    catch_up = obj.get("catch_up") or "once"
    if catch_up not in CATCH_UP_POLICIES:
        raise InvalidPeriodic(
            f"catch_up must be one of {CATCH_UP_POLICIES}, not {catch_up!r}", field="catch_up"
        )
    grace = obj.get("grace")
    args = obj.get("args") or ()
    kwargs = obj.get("kwargs") or {}
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        raise InvalidPeriodic("args must be a list and kwargs a dict", field="args")
    queue = obj.get("queue")
    priority = obj.get("priority")
    max_attempts = obj.get("max_attempts")
    ttl = obj.get("ttl")
    return PeriodicDefinition(
        name=name,
        kind=kind,
        schedule=schedule,
        args=tuple(validation.json_normalize(list(args), "args")),
        kwargs=validation.json_normalize(dict(kwargs), "kwargs"),
        catch_up=catch_up,
        grace=validation.positive_duration(grace, "grace") if grace is not None else DEFAULT_GRACE,
        queue=validation.queue_name(queue) if queue is not None else None,
        priority=validation.priority(priority) if priority is not None else None,
        max_attempts=validation.max_attempts(max_attempts) if max_attempts is not None else None,
        tags=validation.tags(obj.get("tags") or ()),
        metadata=validation.json_normalize(dict(obj.get("metadata") or {}), "metadata"),
        ttl=validation.positive_duration(ttl, "ttl") if ttl is not None else None,
    )


# ---------------------------------------------------------------------------
# Declaration

#: Definitions declared in code, by name.
_declared: dict[str, PeriodicDefinition] = {}
_declared_lock = threading.Lock()


def define_periodic(
    job_function: Any,
    *,
    cron: str | None = None,
    every: dt.timedelta | float | None = None,
    tz: str = "UTC",
    name: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    catch_up: CatchUp = "once",
    grace: dt.timedelta | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    tags: Sequence[str] = (),
    metadata: Mapping[str, Any] | None = None,
    ttl: dt.timedelta | None = None,
) -> PeriodicDefinition:
    """Check a periodic declaration and return its definition, registering nothing.

    ``job_function`` is a ``@job`` function, a plain function (its import path
    is the kind) or a kind string. The name defaults to the kind; give one to
    run the same job on two schedules. Raises InvalidPeriodic naming the bad field.
    """

    if isinstance(job_function, JobFunction):
        kind = job_function.kind
    elif isinstance(job_function, str):
        kind = job_function
    elif callable(job_function):
        kind = kind_of(job_function)
    else:
        raise InvalidPeriodic(f"cannot make {job_function!r} periodic", field="job")
    obj: dict[str, Any] = {
        "job": kind, "name": name, "cron": cron, "every": every, "tz": tz, "args": list(args),
        "kwargs": dict(kwargs or {}), "catch_up": catch_up, "grace": grace, "queue": queue,
        "priority": priority, "max_attempts": max_attempts, "tags": list(tags),
        "metadata": dict(metadata or {}), "ttl": ttl,
    }  # fmt: skip
    return _build(obj, source=f"periodic({kind})")


def register_periodic(job_function: Any, **options: Any) -> PeriodicDefinition:
    """Declare a periodic job (see :func:`define_periodic`) and return its definition.

    Declaring the same name again with the same definition (a module imported
    twice) is allowed; with another, it is an error.
    """
    definition = define_periodic(job_function, **options)
    with _declared_lock:
        existing = _declared.get(definition.name)
        if existing is not None and existing != definition:
            raise InvalidPeriodic(
                f"periodic job {definition.name!r} is declared twice with different "
                "definitions; give one of them another name",
                field="name",
            )
        _declared[definition.name] = definition
    return definition


def periodic(
    cron: str | None = None,
    *,
    every: dt.timedelta | float | None = None,
    tz: str = "UTC",
    name: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    catch_up: CatchUp = "once",
    grace: dt.timedelta | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    tags: Sequence[str] = (),
    metadata: Mapping[str, Any] | None = None,
    ttl: dt.timedelta | None = None,
) -> Callable[[J], J]:
    """Decorate a ``@job`` function (put it above ``@job``) to run it on a schedule.

    The schedule is checked now, so a bad cron spec fails at import with an
    error that names it. The function is returned unchanged.
    """

    def decorate(job_function: J) -> J:
        register_periodic(
            job_function, cron=cron, every=every, tz=tz, name=name, args=args, kwargs=kwargs,
            catch_up=catch_up, grace=grace, queue=queue, priority=priority,
            max_attempts=max_attempts, tags=tags, metadata=metadata, ttl=ttl,
        )  # fmt: skip
        return job_function

    return decorate


def unregister_periodic(name: str) -> None:
    """Forget a periodic job declared in code (tests, and code that swaps schedules)."""
    with _declared_lock:
        _declared.pop(name, None)


def setting_definitions() -> list[PeriodicDefinition]:
    """Return the definitions of ``HOPPER["PERIODIC"]``; raise InvalidPeriodic if one is bad."""

    entries = hopper_settings.PERIODIC or []
    if not isinstance(entries, list | tuple):
        raise InvalidPeriodic("HOPPER['PERIODIC'] must be a list of dicts", field="PERIODIC")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise InvalidPeriodic(f"HOPPER['PERIODIC'][{i}] must be a dict", field="PERIODIC")
        out.append(_build(dict(entry), source=f"HOPPER['PERIODIC'][{i}]"))
    return out


def definitions() -> list[PeriodicDefinition]:
    """Return every periodic job this process declares (code and settings), by name.

    A name declared both ways, or twice in settings, is an error.
    """
    with _declared_lock:
        out = dict(_declared)
    for definition in setting_definitions():
        if definition.name in out:
            raise InvalidPeriodic(
                f"periodic job {definition.name!r} is declared more than once "
                "(HOPPER['PERIODIC'] and code, or twice in HOPPER['PERIODIC'])",
                field="name",
            )
        out[definition.name] = definition
    return [out[name] for name in sorted(out)]


# ---------------------------------------------------------------------------
# Operator controls: run now, disable, enable


def _current_definition(engine: BaseEngine, name: str) -> dict[str, Any]:
    """Return the definition a leader would insert ``name`` from: the newest live
    client's registration, else this process's declaration. Raises NotFound."""
    rows = [r for r in engine.periodic_registrations() if r.name == name]
    if rows:
        newest = max(rows, key=lambda r: (r.client_started_at, r.client_id))
        return dict(newest.definition)
    for definition in definitions():
        if definition.name == name:
            return definition.to_json()
    raise NotFound(
        f"no periodic job is named {name!r} (none is declared here or registered by a live worker)"
    )


def periodic_states() -> list[PeriodicSlotRow]:
    """Return every periodic job's recorded state (last slot, disabled), by name."""
    return get_engine().periodic_list()


def run_periodic_now(name: str) -> PeriodicRunNowResult:
    """Insert a periodic job's run now, never double-firing with the leader's tick.

    If a slot is due now and not yet inserted (the leader is about to, or it
    was down), the run is that slot's job, and the leader does not insert it
    again; had the leader just inserted it, its job is returned
    (``inserted=False``). Otherwise the run is an extra job outside the
    schedule (metadata ``run_now``), which leaves the next slots as they are;
    while it waits or runs, another run now returns it. A disabled job can be
    run now (an extra run; it stays disabled). Raises NotFound for a name no
    live worker registers and this process does not declare.
    """
    engine = get_engine()
    definition_json = _current_definition(engine, name)
    definition = PeriodicDefinition.from_json(definition_json)
    state = next((s for s in engine.periodic_list() if s.name == name), None)
    now = engine.now()
    slot = None
    if state is None or state.disabled_at is None:
        slot = due_slot(
            definition.schedule,
            last_slot=state.settled if state is not None else None,
            now=now,
            catch_up=definition.catch_up,
            grace=definition.grace,
        )
    extra = run_now_params(definition_json, name, now)
    return engine.periodic_run_now(
        PeriodicRunNowParams(
            name=name,
            job=job_params(definition_json, name, slot) if slot is not None else extra,
            extra=extra,
            slot=slot,
        )
    )


def _known(engine: BaseEngine, name: str) -> None:
    """Refuse a name that is neither registered, declared here, nor recorded (a typo)."""
    if any(s.name == name for s in engine.periodic_list()):
        return
    _current_definition(engine, name)


def disable_periodic(name: str) -> PeriodicSlotRow:
    """Stop inserting a periodic job's slots until :func:`enable_periodic`.

    Stored in the database, so it holds across deploys and on every leader,
    whatever the code declares. A job already inserted still runs (cancel it
    to stop it). Raises NotFound for an unknown name.
    """
    engine = get_engine()
    _known(engine, name)
    return engine.periodic_disable(PeriodicDisableParams(name=name))


def enable_periodic(name: str) -> PeriodicSlotRow:
    """Insert a disabled periodic job's slots again, from the next one on time:
    the slots that fell while it was disabled are skipped, not caught up.
    Raises NotFound for an unknown name."""
    engine = get_engine()
    _known(engine, name)
    return engine.periodic_enable(PeriodicEnableParams(name=name))


# ---------------------------------------------------------------------------
# System check


@register("hopper")
def check_periodic(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Report bad periodic declarations (a bad cron spec, an unknown zone ...) at start-up."""
    try:
        definitions()
    except InvalidJob as exc:
        return [
            Error(
                f"Invalid periodic job: {exc}",
                hint="Fix the declaration in HOPPER['PERIODIC'] or the @periodic decorator.",
                id="hopper.E601",
            )
        ]
    return []
