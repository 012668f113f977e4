"""Publish/subscribe: topics fan out to subscriber jobs, in the caller's transaction.

A subscription names a topic pattern and a ``@job`` function; every publish to
a matching topic inserts one *delivery*, a job of that function called with
the message::

    @job(queue="billing")
    def bill(message: Message) -> None:
        order_id = message["payload"]["order_id"]
        ...

    subscribe("billing", "orders.*", bill)          # declared in code

    with transaction.atomic():
        order = Order.objects.create(...)
        publish("orders.created", {"order_id": order.pk})   # commits with the order

Patterns follow AMQP topic exchanges: words separated by ``.``, ``*`` matches
one word, ``#`` zero or more (:mod:`django_hopper.engine.topics`). Declared
subscriptions are upserted when a worker starts (``hopper_worker``), or at
once with ``subscribe(..., save=True)`` / :func:`sync_subscriptions`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_hopper import signals, validation
from django_hopper.conf import hopper_settings
from django_hopper.engine import get_engine, topics
from django_hopper.engine.params import (
    MessagePublishParams,
    RouteDeleteResult,
    SubscriptionDeleteParams,
    SubscriptionPauseParams,
    SubscriptionResumeParams,
    SubscriptionResumeResult,
)
from django_hopper.engine.topics import Message
from django_hopper.exceptions import InvalidJob
from django_hopper.jobs import JobFunction, JobHandle
from django_hopper.types import SubscriptionRow

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.jobs import JobHandle
    from django_hopper.types import SubscriptionRow

__all__ = [
    "Message",
    "Subscription",
    "list_subscriptions",
    "pause_subscription",
    "publish",
    "resume_subscription",
    "subscribe",
    "sync_subscriptions",
    "unsubscribe",
]

#: Subscriptions declared in code, by name; upserted by sync_subscriptions().
declared: dict[str, Subscription] = {}
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription as declared in code."""

    name: str
    pattern: str
    kind: str
    queue: str
    #: 0: the default (25, or 10 for deliveries with an ordering key).
    max_attempts: int = 0
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def row(self) -> SubscriptionRow:
        """Return the engine row this declaration upserts."""

        return SubscriptionRow(
            name=self.name,
            pattern=self.pattern,
            kind=self.kind,
            queue=self.queue,
            max_attempts=self.max_attempts,
            metadata=dict(self.metadata),
        )


def kind_and_queue(job_fn: Any, queue: str | None) -> tuple[str, str]:
    """Return the kind a subscriber's deliveries get, and their queue.

    ``job_fn`` is a ``@job`` function (its queue is the default) or a kind
    string (the default queue is then ``HOPPER["DEFAULT_QUEUE"]``).
    """

    if isinstance(job_fn, JobFunction):
        kind, default_queue = job_fn.kind, job_fn.queue
    elif isinstance(job_fn, str) and job_fn:
        kind, default_queue = job_fn, hopper_settings.DEFAULT_QUEUE
    else:
        raise InvalidJob(
            f"job_fn must be a @job function or a job kind, not {job_fn!r}", field="job_fn"
        )
    return kind, validation.queue_name(queue if queue is not None else default_queue)


def subscribe(
    name: str,
    pattern: str,
    job_fn: Any,
    *,
    queue: str | None = None,
    max_attempts: int = 0,
    metadata: Mapping[str, Any] | None = None,
    save: bool = False,
) -> Subscription:
    """Declare a subscription: publishes to topics matching ``pattern`` run ``job_fn``.

    Checked now, so a typo fails at import rather than at the first publish.
    Recorded in the database when a worker starts, or now with ``save=True``
    (a declaration made while serving requests would otherwise wait for one).
    """
    kind, q = kind_and_queue(job_fn, queue)
    sub = Subscription(
        name=topics.check_name(name),
        pattern=topics.check_pattern(pattern),
        kind=kind,
        queue=q,
        max_attempts=topics.check_max_attempts(max_attempts),
        metadata=topics.check_metadata(dict(metadata) if metadata is not None else None),
    )
    with _lock:
        declared[sub.name] = sub
    if save:
        sync_subscriptions([sub])
    return sub


def sync_subscriptions(
    subscriptions: list[Subscription] | None = None, engine: BaseEngine | None = None
) -> int:
    """Upsert subscriptions (default: every declared one); return how many."""

    subs = list(declared.values()) if subscriptions is None else subscriptions
    if subs:
        (engine or get_engine()).subscription_upsert([s.row() for s in subs])
    return len(subs)


def list_subscriptions() -> list[SubscriptionRow]:
    """Return every subscription recorded in the database, by name."""

    return get_engine().subscription_list()


def publish(
    topic: str,
    payload: Any = None,
    *,
    headers: Mapping[str, str] | None = None,
    ordering_key: str | None = None,
    dedup_key: str | None = None,
    delay: dt.timedelta | float | None = None,
    ttl: dt.timedelta | float | None = None,
    priority: int = 0,
    awaited: bool = False,
) -> list[JobHandle]:
    """Publish a message: one delivery job per matching subscription, in subscription
    name order, inserted in the caller's transaction (it commits or rolls back with
    it), and workers woken at commit.

    ``dedup_key`` makes the publish idempotent while an earlier delivery is live:
    each subscription's handle is then its existing delivery, with
    ``duplicate=True``. ``delay`` and ``ttl`` are timedeltas or seconds.
    """

    if delay is not None and not isinstance(delay, dt.timedelta):
        if not isinstance(delay, int | float) or isinstance(delay, bool):
            raise InvalidJob(f"delay must be a timedelta or seconds, not {delay!r}", field="delay")
        delay = dt.timedelta(seconds=delay)
    if ttl is not None:
        ttl = validation.positive_duration(ttl, "ttl")
    engine = get_engine()
    results = engine.message_publish(
        MessagePublishParams(
            topic=topic,
            payload=payload,
            headers=topics.check_headers(headers),
            ordering_key=ordering_key,
            dedup_key=dedup_key,
            delay=delay,
            ttl=ttl,
            priority=priority,
            awaited=awaited,
            notify=True,
        )
    )
    return [JobHandle(r.job, duplicate=r.duplicate, alias=engine.alias) for r in results]


def pause_subscription(name: str) -> SubscriptionRow:
    """Hold a subscription's deliveries until :func:`resume_subscription`; lose none.

    Publishes while it is paused still make its deliveries, held (scheduled
    at ``HELD_AT``, nothing runs them); deliveries made before the pause run
    as usual. The pause is stored: a worker re-declaring the subscription
    keeps it paused. Raises NotFound for an unknown subscription.
    """
    return get_engine().subscription_pause(SubscriptionPauseParams(name=name))


def resume_subscription(name: str) -> SubscriptionResumeResult:
    """Deliver again and release the held deliveries (due now, workers woken at
    commit); ``released`` says how many. Raises NotFound."""
    return get_engine().subscription_resume(SubscriptionResumeParams(name=name))


def unsubscribe(name: str, *, cancel_pending: bool = False) -> RouteDeleteResult:
    """Delete a subscription: later publishes make no delivery for it.

    Its deliveries already made still run (they were accepted for delivery;
    held ones are released), unless ``cancel_pending``: then every one that is
    not running is canceled in the same transaction (``jobs_ended`` is sent
    for them at commit); running ones finish. The declaration is forgotten in
    this process too, so a later :func:`sync_subscriptions` here does not
    create it again; a process whose code still declares it does, at its next
    worker start. Raises NotFound for an unknown subscription.
    """
    engine = get_engine()
    result = engine.subscription_delete(
        SubscriptionDeleteParams(name=name, cancel_pending=cancel_pending)
    )
    with _lock:
        declared.pop(name, None)
    announce_ended(result, engine.alias)
    return result


def announce_ended(result: RouteDeleteResult, alias: str) -> None:
    """Send ``jobs_ended`` for the deliveries a delete canceled, once it commits."""
    ended = list(result.ended)
    if ended and signals.jobs_ended.receivers:
        transaction.on_commit(
            lambda: signals.send_logged(signals.jobs_ended, jobs=ended), using=alias
        )
