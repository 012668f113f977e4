"""The engine's validation front: every params object is checked here, once.

:class:`~django_hopper.engine.base.BaseEngine` calls these before a vendor
hook runs, so the two engines refuse the same inputs with the same
:class:`~django_hopper.exceptions.InvalidJob` (naming the field) and write
nothing. The tests in ``tests/engine_conformance/test_validation.py`` pin
every rule on both engines.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from django_hopper import validation
from django_hopper.engine import topics
from django_hopper.engine.params import (
    BatchDuplicatesParams,
    BatchInsertParams,
    HistoryIndexParams,
    JobClaimByIDParams,
    JobFinalize,
    JobInsertOpts,
    JobInsertParams,
    JobListParams,
    JobPassBeginParams,
    JobPassGetManyParams,
    JobPassMissParams,
    JobPassTakeoverParams,
    JobRecordProgressParams,
    JobReturnManyParams,
    PeriodicRunNowParams,
    SchemaLockParams,
    StatsBoundedParams,
    StreamConsumerDeleteParams,
    StreamConsumerLagParams,
    SubscriptionDeleteParams,
    WorkflowInsertParams,
)
from django_hopper.engine.rules import validate_workflow
from django_hopper.exceptions import InvalidJob, UnknownQueue
from django_hopper.types import ConflictAction, JobState

#: The states a finalize may leave a job in: to history, or back to waiting.
FINALIZE_STATES: tuple[JobState, ...] = (
    JobState.COMPLETED,
    JobState.CANCELED,
    JobState.DISCARDED,
    JobState.RETRYABLE,
    JobState.SCHEDULED,
)
_FINALIZE_STATES = frozenset(FINALIZE_STATES)
_ALL_STATES = frozenset(JobState.values())
_MICROSECOND = dt.timedelta(microseconds=1)


def limit(value: Any, field: str = "limit") -> int:
    """Return a non-negative integer limit (0: do nothing) or raise InvalidJob naming it."""
    if type(value) is not int or value < 0:
        raise InvalidJob(f"{field} must be a non-negative integer, not {value!r}", field=field)
    return value


def return_many(params: JobReturnManyParams) -> None:
    """Refuse a return whose client or jobs are not well formed."""
    if type(params.client_id) is not int:
        raise InvalidJob(
            f"client_id must be an integer, not {params.client_id!r}", field="client_id"
        )
    for i, pair in enumerate(params.jobs):
        if (
            not isinstance(pair, tuple)
            or len(pair) != 2
            or not isinstance(pair[0], uuid.UUID)
            or type(pair[1]) is not int
        ):
            raise InvalidJob(
                f"jobs[{i}] must be a (job ID, fence) pair, not {pair!r}", field="jobs"
            )


def positive_limit(value: Any, field: str = "limit") -> int:
    """Return a positive integer limit or raise InvalidJob naming it."""
    if type(value) is not int or value <= 0:
        raise InvalidJob(f"{field} must be a positive integer, not {value!r}", field=field)
    return value


def ttl(value: Any, field: str = "ttl") -> dt.timedelta:
    """Return a lease duration of at least a microsecond or raise InvalidJob naming it."""
    if not isinstance(value, dt.timedelta) or value < _MICROSECOND:
        raise InvalidJob(
            f"{field} must be a timedelta of at least a microsecond, not {value!r}", field=field
        )
    validation.duration_max(value, field)
    return value


def flag(value: Any, field: str) -> bool:
    """Return a True/False option or raise InvalidJob naming it (1 or "yes" is a mistake)."""
    if type(value) is not bool:
        raise InvalidJob(f"{field} must be True or False, not {value!r}", field=field)
    return value


def fence(value: Any, field: str = "fence") -> int:
    """Return a claim's fence (a non-negative integer) or raise InvalidJob naming it."""
    if type(value) is not int or value < 0:
        raise InvalidJob(f"{field} must be a non-negative integer, not {value!r}", field=field)
    return value


def claim_by_id(params: JobClaimByIDParams) -> None:
    """Refuse a claim by ID with a bad lease TTL, fence or wait option."""
    ttl(params.ttl)
    fence(params.fence)
    flag(params.no_wait, "no_wait")


def record_progress(params: JobRecordProgressParams) -> None:
    """Refuse a progress record the statement would store wrongly or not match at all.

    The step must be text even with ``keep_step`` (where it is ignored), so a
    caller's mistake never depends on the flag; the cursor must read back as
    written (JSON, no NUL), on both engines.
    """
    flag(params.keep_step, "keep_step")
    flag(params.no_wait, "no_wait")
    if not isinstance(params.step, str):
        raise InvalidJob(f"step must be a string, not {params.step!r}", field="step")
    if "\x00" in params.step:
        raise InvalidJob("step must not contain a NUL character", field="step")
    fence(params.fence)
    if type(params.attempt) is not int or params.attempt < 0:
        raise InvalidJob(
            f"attempt must be a non-negative integer, not {params.attempt!r}", field="attempt"
        )
    validation.json_normalize(params.cursor, "cursor")


def insert(p: JobInsertParams, *, copy: bool = False) -> None:
    """Refuse an input the database would refuse (or one engine would silently mangle)."""
    validation.kind(p.kind)
    validation.queue_name(p.queue)
    validation.priority(p.priority)
    validation.max_attempts(p.max_attempts)
    if p.scheduled_at is not None:
        validation.aware(p.scheduled_at, "scheduled_at")
    if p.ttl is not None:
        validation.positive_duration(p.ttl, "ttl")
    # The keys most jobs leave unset are tested here, not called into.
    if p.unique_key is not None:
        validation.key(p.unique_key, "unique_key")
    if p.ordering_key is not None:
        validation.key(p.ordering_key, "ordering_key")
    if p.partition_key is not None:
        validation.key(p.partition_key, "partition_key")
    if p.subject is not None:
        validation.key(p.subject, "subject")
    tags = p.tags
    if (type(tags) is not tuple or tags) and not _good_tags(tags):  # most jobs have none
        raise InvalidJob(
            f"tags must be non-empty strings without NUL or a lone surrogate, not {tags!r}",
            field="tags",
        )
    if not isinstance(p.metadata, dict):
        raise InvalidJob(
            f"metadata must be a JSON object (a dict), not {type(p.metadata).__name__}",
            field="metadata",
        )
    if p.unique_finished:
        validation.unique_finished(p.unique_finished)
    if p.id is not None and not isinstance(p.id, uuid.UUID):
        raise InvalidJob(f"id must be a UUID, not {p.id!r}", field="id")
    if p.batch_id is not None and not isinstance(p.batch_id, uuid.UUID):
        raise InvalidJob(f"batch_id must be a UUID, not {p.batch_id!r}", field="batch_id")
    if copy and p.unique_key is not None:
        raise InvalidJob(
            "job_insert_copy takes no unique keys; use job_insert_many", field="unique_key"
        )


def _good_tags(tags: Any) -> bool:
    """Return whether ``tags`` is a list or tuple of non-empty, storable strings."""
    return isinstance(tags, tuple | list) and all(
        isinstance(t, str) and t and validation.storable_text(t) for t in tags
    )


#: Every conflict action (read per insert: the tuple is made once).
_CONFLICT_ACTIONS = ConflictAction.values()


def insert_opts(opts: JobInsertOpts) -> None:
    """Refuse an unknown conflict action."""
    if opts.on_conflict not in _CONFLICT_ACTIONS:
        raise InvalidJob(
            f"on_conflict must be one of {', '.join(ConflictAction.values())}, "
            f"not {opts.on_conflict!r}",
            field="on_conflict",
        )


def callbacks(*params: JobInsertParams | None) -> None:
    """Refuse a callback the insert at completion would refuse, before anything is written."""
    for p in params:
        if p is not None:
            insert(p)


def batch(params: BatchInsertParams) -> None:
    """Refuse a batch with a bad total or callback."""
    total = params.total
    if type(total) is not int or total < 0:
        raise InvalidJob(f"total must be a non-negative integer, not {total!r}", field="total")
    callbacks(params.on_success, params.on_failure, params.on_complete)


def subject(value: Any) -> str:
    """Return a data subject key, or refuse one that no job could carry."""
    if value is None:
        raise InvalidJob("subject must be a non-empty string, not None", field="subject")
    checked = validation.key(value, "subject")
    assert checked is not None
    return checked


def batch_duplicates(params: BatchDuplicatesParams) -> None:
    """Refuse a duplicate that is not a pair of UUIDs (batch, job)."""
    for pair in params.duplicates:
        if (
            not isinstance(pair, tuple)
            or len(pair) != 2
            or not all(isinstance(v, uuid.UUID) for v in pair)
        ):
            raise InvalidJob(
                f"duplicates must be (batch ID, job ID) pairs of UUIDs, not {pair!r}",
                field="duplicates",
            )


def workflow(params: WorkflowInsertParams) -> None:
    """Refuse an invalid workflow, job or callback."""
    validate_workflow(params)
    for p in params.jobs:
        insert(p)
    callbacks(params.on_success, params.on_failure, params.on_complete)


_NO_DELAY = dt.timedelta(0)


def finalize(results: Sequence[JobFinalize]) -> None:
    """Refuse a result that would leave its job running, or wait a negative delay."""
    for f in results:
        if f.state not in _FINALIZE_STATES:
            raise InvalidJob(
                f"a result's state must be one of {', '.join(FINALIZE_STATES)}, not {f.state!r}",
                field="state",
            )
        if not isinstance(f.delay, dt.timedelta) or f.delay < _NO_DELAY:
            raise InvalidJob(f"delay must not be negative, not {f.delay!r}", field="delay")


def job_list(params: JobListParams) -> None:
    """Refuse a listing filter no job could match for a reason the caller should hear."""
    limit(params.limit)
    if params.ordering_key is not None and params.queue is None:
        raise InvalidJob(
            "ordering_key needs queue: a key is a lane only within its queue",
            field="ordering_key",
        )
    unknown = [s for s in params.states if s not in _ALL_STATES]
    if unknown:
        raise InvalidJob(f"unknown job states {unknown!r}", field="states")
    if params.metadata is not None and not isinstance(params.metadata, dict):
        raise InvalidJob(
            f"metadata must be a JSON object, not {params.metadata!r}", field="metadata"
        )


def queue_names(names: Any) -> list[str]:
    """Return distinct valid queue names, sorted, or raise UnknownQueue naming ``names``."""
    if isinstance(names, str):
        raise UnknownQueue(f"names must be a list of queue names, not {names!r}", field="names")
    return sorted({validation.queue_name(name, "names") for name in names})


def ordering_key(value: Any) -> str:
    """Return a required ordering key or raise InvalidJob."""
    key = validation.key(value, "ordering_key")
    if key is None:
        raise InvalidJob("ordering_key must be a non-empty string", field="ordering_key")
    return key


def step(value: Any) -> str:
    """Return a step name of 1 to 255 characters or raise InvalidJob."""
    if not isinstance(value, str) or not value or len(value) > 255:
        raise InvalidJob(f"a step name must be 1-255 characters, not {value!r}", field="step")
    return value


def channel(value: Any) -> str:
    """Return a notification channel name or raise InvalidJob."""
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"channel must be a non-empty string, not {value!r}", field="channel")
    return value


# -- pass leases of resumable runs ---------------------------------------------


def _pass_claim(p: JobPassBeginParams | JobPassMissParams) -> None:
    """Refuse a pass's claim that names no holder, or a bad fence."""
    if type(p.fence) is not int or p.fence < 1:
        raise InvalidJob(f"fence must be a positive integer, not {p.fence!r}", field="fence")
    if p.lease_token is None and (type(p.attempted_by) is not int):
        raise InvalidJob(
            "a pass's claim is a client (attempted_by) or a job lease (lease_token)",
            field="attempted_by",
        )
    if p.lease_token is not None and not isinstance(p.lease_token, uuid.UUID):
        raise InvalidJob(f"lease_token must be a UUID, not {p.lease_token!r}", field="lease_token")


def max_misses(value: Any) -> int:
    """Return the admission-miss bound (a positive integer) or raise InvalidJob naming it."""
    return positive_limit(value, "max_misses")


def pass_begin(p: JobPassBeginParams) -> None:
    """Refuse a BEGIN with a lease under the floor or a margin that is not inside it."""
    _pass_claim(p)
    validation.pass_lease(p.ttl, "ttl")
    if not isinstance(p.margin, dt.timedelta) or not dt.timedelta(0) <= p.margin < p.ttl:
        raise InvalidJob(
            f"margin must be a duration >= 0 and shorter than the lease, not {p.margin!r}",
            field="margin",
        )


def pass_miss(p: JobPassMissParams) -> None:
    """Refuse an admission miss with no bound or no reason."""
    _pass_claim(p)
    max_misses(p.max_misses)
    if not isinstance(p.reason, str) or not p.reason or "\x00" in p.reason:
        raise InvalidJob(f"reason must be a non-empty string, not {p.reason!r}", field="reason")


def pass_get_many(p: JobPassGetManyParams) -> None:
    """Refuse IDs that are not UUIDs, naming the field."""
    if isinstance(p.ids, str | bytes) or not all(isinstance(i, uuid.UUID) for i in p.ids):
        raise InvalidJob(f"ids must be job IDs (UUIDs), not {p.ids!r}", field="ids")


def pass_takeover(p: JobPassTakeoverParams) -> None:
    """Refuse a takeover with bad kinds, queue, limit or bound."""
    if not isinstance(p.kinds, tuple) or not all(isinstance(k, str) and k for k in p.kinds):
        raise InvalidJob(f"kinds must be a tuple of job kinds, not {p.kinds!r}", field="kinds")
    if p.queue is not None:
        validation.queue_name(p.queue)
    limit(p.limit)
    max_misses(p.max_misses)


def schema_lock(params: SchemaLockParams) -> None:
    """Check the migration lock's polling: a positive interval, a callable to tell."""
    interval = params.poll_interval
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise InvalidJob(
            f"poll_interval must be a positive number of seconds, not {interval!r}",
            field="poll_interval",
        )
    if params.on_wait is not None and not callable(params.on_wait):
        raise InvalidJob("on_wait must be callable", field="on_wait")


def history_index(params: HistoryIndexParams) -> None:
    """Check a history index pass: names are strings, timeouts not negative."""
    for name, values in (("skip", params.skip), ("skip_repair", params.skip_repair)):
        if isinstance(values, str) or not all(isinstance(v, str) and v for v in values):
            raise InvalidJob(f"{name} must be a sequence of non-empty names", field=name)
    for name, value in (
        ("lock_timeout", params.lock_timeout),
        ("statement_timeout", params.statement_timeout),
    ):
        if not isinstance(value, dt.timedelta) or value < dt.timedelta(0):
            raise InvalidJob(f"{name} must be a non-negative timedelta", field=name)


# ---------------------------------------------------------------------------
# Subscriptions, stream consumers and periodic jobs: the operator's controls


def route_name(value: Any) -> str:
    """Return a valid subscription, consumer or periodic job name, or raise InvalidJob.

    The three share one alphabet (letters, digits, ``_ . : -``, 1..255).
    """
    return topics.check_name(value)


def now(value: Any) -> None:
    """Refuse an injected clock that is not an aware datetime."""
    if value is not None:
        validation.aware(value, "now")


def route_control(params: Any) -> str:
    """Check a pause, resume, reset, enable or disable: a name and the clock."""
    now(params.now)
    return route_name(params.name)


def route_delete(params: SubscriptionDeleteParams | StreamConsumerDeleteParams) -> str:
    """Check a subscription or consumer delete."""
    flag(params.cancel_pending, "cancel_pending")
    return route_control(params)


def stats_bounded(params: StatsBoundedParams) -> None:
    """Check a bounded stats read: a positive limit and the clock."""
    positive_limit(params.limit)
    now(params.now)


def consumer_lag(params: StreamConsumerLagParams) -> None:
    """Check a lag read: names and a positive cap."""
    if isinstance(params.names, str) or not isinstance(params.names, Sequence):
        raise InvalidJob(f"names must be a sequence of names, not {params.names!r}", field="names")
    for name in params.names:
        route_name(name)
    positive_limit(params.limit)


def periodic_run_now(params: PeriodicRunNowParams) -> None:
    """Check a run now: its name, its slot (aware), its job."""
    route_control(params)
    if params.slot is not None:
        validation.aware(params.slot, "slot")
    insert(params.job)
    insert(params.extra)


def index_name(value: Any) -> str:
    """Return an index name (a non-empty string) or raise InvalidJob naming it."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidJob(f"an index name must be a non-empty string, not {value!r}", field="name")
    return value
