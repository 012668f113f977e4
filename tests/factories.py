"""factory-boy factories for hopper's tables, aware of the job state machine.

Conformance tests drive jobs through engine methods (insert, claim, finalize)
so that they test the engines; these factories set up the states that are
awkward to reach that way (a pending job, a job leased by ID, a job in history
with a chosen finalize time, a client that expired long ago, a paused queue).

Every time is an aware UTC ``datetime`` with a non-zero microsecond: on SQLite,
Django writes ``str(value)``, which drops the fraction when it is zero, and the
engine relies on the text always carrying six fraction digits (text order is
time order). Pass ``now=db_now`` (from the ``db_now`` fixture) so that rows line
up with the times the test injects into engine calls; the state traits place
their times relative to it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import factory
from factory.django import DjangoModelFactory

from django_hopper.ids import new_id
from django_hopper.models import Client, Job, JobHistory, JobLog, Leader, Queue

UTC = dt.UTC


def aware_utc(value: dt.datetime) -> dt.datetime:
    """Return ``value`` in UTC, refusing naive times, with a non-zero microsecond."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"factory times must be timezone-aware, got {value!r}")
    value = value.astimezone(UTC)
    if value.microsecond == 0:
        value = value.replace(microsecond=1)
    return value


def utc_now() -> dt.datetime:
    """The machine's clock as an aware UTC time (the default ``now`` of the factories)."""
    return aware_utc(dt.datetime.now(UTC))


def _at(offset: dt.timedelta) -> Any:
    """A lazy attribute: the factory's ``now`` plus ``offset``."""
    return factory.LazyAttribute(lambda o: aware_utc(o.now + offset))


def error_entry(
    at: dt.datetime, attempt: int, error: str = "boom", *, fence: int = 0, rescue: str = ""
) -> dict[str, Any]:
    """One stored AttemptError object, as the engines write it into ``errors``."""
    out: dict[str, Any] = {"at": aware_utc(at).isoformat(), "attempt": attempt, "error": error}
    if fence:
        out["fence"] = fence
    if rescue:
        out["rescue"] = rescue
    return out


class _JobFields(DjangoModelFactory):
    """Columns shared by live jobs and history."""

    class Meta:
        abstract = True

    class Params:
        #: The reference time every other time of the row is placed from.
        now = factory.LazyFunction(utc_now)

    id = factory.LazyFunction(new_id)
    kind = "tests.job"
    queue = "default"
    state = "available"
    priority = 0
    attempt = 0
    max_attempts = 25
    fence = 0
    args = factory.LazyFunction(lambda: {"args": [], "kwargs": {}})
    metadata = factory.LazyFunction(dict)
    errors = factory.LazyFunction(list)
    tags = factory.LazyFunction(list)
    created_at = factory.LazyAttribute(lambda o: aware_utc(o.now))
    scheduled_at = factory.LazyAttribute(lambda o: aware_utc(o.now))

    @classmethod
    def _create(cls, model_class: type[Any], *args: Any, **kwargs: Any) -> Any:
        for key, value in list(kwargs.items()):
            if isinstance(value, dt.datetime):
                kwargs[key] = aware_utc(value)
        return super()._create(model_class, *args, **kwargs)


class JobFactory(_JobFields):
    """A live job (``hopper_job``). Default: available, never claimed.

    Traits: ``scheduled`` (waiting for a future time), ``snoozed`` (scheduled
    with a snooze reason), ``retryable_due`` (failed once, due now),
    ``retryable_later`` (failed once, due in an hour), ``pending`` (waiting on
    dependencies), ``running`` (claimed at ``now``: pass ``attempted_by`` and
    optionally ``fence``), ``leased`` (running under a job lease, no client).
    """

    class Meta:
        model = Job

    class Params:
        scheduled = factory.Trait(state="scheduled", scheduled_at=_at(dt.timedelta(hours=1)))
        snoozed = factory.Trait(
            state="scheduled",
            attempt=0,
            fence=1,
            attempted_at=_at(dt.timedelta(0)),
            scheduled_at=_at(dt.timedelta(hours=1)),
            snooze_reason="snoozed by the factory",
        )
        retryable_due = factory.Trait(
            state="retryable",
            attempt=1,
            fence=1,
            attempted_at=_at(-dt.timedelta(minutes=1)),
            scheduled_at=_at(-dt.timedelta(seconds=1)),
            errors=factory.LazyAttribute(
                lambda o: [error_entry(o.now - dt.timedelta(minutes=1), 1, fence=1)]
            ),
        )
        retryable_later = factory.Trait(
            state="retryable",
            attempt=1,
            fence=1,
            attempted_at=_at(-dt.timedelta(minutes=1)),
            scheduled_at=_at(dt.timedelta(hours=1)),
            errors=factory.LazyAttribute(
                lambda o: [error_entry(o.now - dt.timedelta(minutes=1), 1, fence=1)]
            ),
        )
        pending = factory.Trait(state="pending")
        running = factory.Trait(
            state="running", attempt=1, fence=1, attempted_at=_at(dt.timedelta(0))
        )
        leased = factory.Trait(
            state="running",
            attempt=1,
            fence=1,
            attempted_at=_at(dt.timedelta(0)),
            attempted_by=None,
            lease_token=factory.LazyFunction(new_id),
            lease_expires_at=_at(dt.timedelta(minutes=5)),
            lease_renewed_at=_at(dt.timedelta(0)),
        )


class HistoryFactory(_JobFields):
    """A finalized job (``hopper_job_history``). Default: completed at ``now``.

    Traits: ``completed``, ``canceled`` (canceled while waiting: never run),
    ``discarded`` (ran out of attempts).
    """

    class Meta:
        model = JobHistory

    state = "completed"
    attempt = 1
    fence = 1
    attempted_by = None
    attempted_at = factory.LazyAttribute(lambda o: aware_utc(o.now - dt.timedelta(seconds=1)))
    finalized_at = factory.LazyAttribute(lambda o: aware_utc(o.now))
    output = None

    class Params:
        completed = factory.Trait(state="completed", output={"ok": True})
        canceled = factory.Trait(
            state="canceled",
            attempt=0,
            fence=0,
            attempted_at=None,
            errors=factory.LazyAttribute(
                lambda o: [error_entry(o.now, 0, "canceled", rescue="canceled")]
            ),
        )
        discarded = factory.Trait(
            state="discarded",
            attempt=3,
            max_attempts=3,
            fence=3,
            errors=factory.LazyAttribute(
                lambda o: [error_entry(o.now, n, fence=n) for n in (1, 2, 3)]
            ),
        )


class JobLogFactory(DjangoModelFactory):
    """One attempt's log of a job."""

    class Meta:
        model = JobLog

    class Params:
        now = factory.LazyFunction(utc_now)

    job_id = factory.LazyFunction(new_id)
    attempt = 1
    snoozed = False
    log = "a line\n"
    created_at = factory.LazyAttribute(lambda o: aware_utc(o.now))


class QueueFactory(DjangoModelFactory):
    """A known queue. Traits: ``paused``, ``limited`` (a global limit)."""

    class Meta:
        model = Queue
        django_get_or_create = ("name",)

    class Params:
        now = factory.LazyFunction(utc_now)
        paused = factory.Trait(paused_at=_at(dt.timedelta(0)))
        limited = factory.Trait(global_limit=5)

    name = factory.Sequence(lambda n: f"queue-{n}")
    created_at = factory.LazyAttribute(lambda o: aware_utc(o.now))
    updated_at = factory.LazyAttribute(lambda o: aware_utc(o.now))


class ClientFactory(DjangoModelFactory):
    """A client lease, live for a minute from ``now``. Trait: ``expired``."""

    class Meta:
        model = Client

    class Params:
        now = factory.LazyFunction(utc_now)
        expired = factory.Trait(
            started_at=_at(-dt.timedelta(minutes=10)),
            expires_at=_at(-dt.timedelta(minutes=5)),
        )

    hostname = factory.Sequence(lambda n: f"host-{n}")
    started_at = factory.LazyAttribute(lambda o: aware_utc(o.now))
    expires_at = factory.LazyAttribute(lambda o: aware_utc(o.now + dt.timedelta(minutes=1)))
    info = factory.LazyFunction(dict)


class LeaderFactory(DjangoModelFactory):
    """The leader lease held by ``client_id`` for a minute from ``now``."""

    class Meta:
        model = Leader

    class Params:
        now = factory.LazyFunction(utc_now)

    name = "default"
    client_id = 1
    elected_at = factory.LazyAttribute(lambda o: aware_utc(o.now))
    expires_at = factory.LazyAttribute(lambda o: aware_utc(o.now + dt.timedelta(minutes=1)))
