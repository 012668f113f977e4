"""The enqueue API: the ``@job`` decorator, ``JobFunction``, ``PreparedJob`` and ``enqueue_many``.

In the spirit of Django's Tasks API::

    @job(queue="emails", max_attempts=5)
    def send_welcome(user_id: int) -> None: ...

    with transaction.atomic():
        user = User.objects.create(...)
        handle = send_welcome.enqueue(user_id=user.pk)  # commits or rolls back with the user

A job's *kind* is its function's import path, so a worker finds the function
by importing it (:func:`django_hopper.registry.resolve`; what ``enqueue``
returns is a :class:`django_hopper.handle.JobHandle`). Decorating touches neither the database nor
the settings, so ``@job`` works in any module, imported at any time; defaults
that come from ``HOPPER`` (queue, max attempts) are read when a job is
enqueued.

Enqueue validates everything before writing anything, then inserts through the
engine on the Django connection of ``HOPPER["DATABASE"]``, so the insert is part
of the caller's transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, ParamSpec, TypeAlias, TypeVar, overload

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from django_hopper import signals, validation
from django_hopper.conf import hopper_settings
from django_hopper.exceptions import InvalidJob
from django_hopper.handle import JobHandle
from django_hopper.ids import new_id, new_ids
from django_hopper.registry import (
    UNKNOWN_KIND_PREFIX,
    kind_of,
    register,
    register_resolver,
    registry,
    resolve,
)
from django_hopper.signals import job_enqueued
from django_hopper.topology import queue_alias
from django_hopper.types import ConflictAction

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.engine.params import JobInsertOpts, JobInsertParams, JobInsertResult
    from django_hopper.types import JobRow

P = ParamSpec("P")
R = TypeVar("R")

#: One item of ``enqueue_many``: keyword arguments, or ``(args, kwargs)``.
BatchItem = Mapping[str, Any] | tuple[Sequence[Any], Mapping[str, Any]]

_UNSET: Any = object()


@dataclasses.dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Per-enqueue options set through ``JobFunction.using(...)``.

    Kept apart from the job's own defaults (queue, priority, max attempts),
    which ``using`` overrides too, so that a handful of fields says everything
    an enqueue adds to the job.
    """

    #: An aware datetime, or a timedelta from now (see ``JobFunction.using``).
    run_after: dt.datetime | dt.timedelta | None = None
    unique_key: str | None = None
    unique_finished: tuple[str, ...] = ()
    replace: bool = False
    ordering_key: str | None = None
    partition_key: str | None = None
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    ttl: dt.timedelta | None = None
    #: Announce the finalize on the done channel, so ``JobHandle.wait`` wakes at once.
    awaited: bool = False
    #: The data subject whose data the job carries (``erase_subject`` finds it by this).
    subject: str | None = None


class JobFunction(Generic[P, R]):
    """A function that can be enqueued as a job; made by :func:`job`.

    Calling it calls the function directly. ``enqueue`` (and ``aenqueue``,
    ``enqueue_many``) stores a job that a worker runs later; ``prepare``
    describes one for :func:`enqueue_many`, which mixes kinds and options.
    Instances are immutable: ``using(...)`` returns a new one with other
    options, so a module-level job can be shared by every thread.

    The worker reads ``func``, ``kind``, ``queue``, ``priority``,
    ``max_attempts``, ``timeout``, ``takes_context``, ``is_async`` and ``archive``.
    """

    func: Callable[P, R]
    kind: str
    priority: int
    #: Seconds an attempt may run, or None for ``HOPPER["JOB_TIMEOUT"]``.
    timeout: float | None
    #: Call the function as ``func(context, *args, **kwargs)``.
    takes_context: bool
    #: Write the completed job to history; None for ``HOPPER["ARCHIVE_COMPLETED"]``.
    archive: bool | None
    options: EnqueueOptions
    #: As given to the decorator (None: the setting); read through ``queue``
    #: and ``max_attempts``.
    _queue: str | None
    _max_attempts: int | None

    __slots__ = (
        "__dict__",  # for __name__, __doc__, __wrapped__ ... (functools-style)
        "_max_attempts",
        "_queue",
        "archive",
        "func",
        "kind",
        "options",
        "priority",
        "takes_context",
        "timeout",
    )

    def __init__(
        self,
        func: Callable[P, R],
        *,
        kind: str,
        queue: str | None,
        priority: int,
        max_attempts: int | None,
        timeout: float | None,
        takes_context: bool,
        archive: bool | None,
        options: EnqueueOptions | None = None,
    ) -> None:
        values = {
            "func": func,
            "kind": kind,
            "_queue": queue,
            "priority": priority,
            "_max_attempts": max_attempts,
            "timeout": timeout,
            "takes_context": takes_context,
            "archive": archive,
            "options": options or EnqueueOptions(),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(func, name):
                self.__dict__[name] = getattr(func, name)
        self.__dict__["__wrapped__"] = func

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use .using(...) for options")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __repr__(self) -> str:
        return f"<JobFunction {self.kind}>"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by kind, so a registered job crosses process boundaries as a name."""
        if self.options != EnqueueOptions() or registry.get(self.kind) is not self:
            return (_rebuild, (self.kind, self._overrides()))
        return (resolve, (self.kind,))

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function now, in this process, as a plain call."""
        return self.func(*args, **kwargs)

    # -- attributes the worker reads ------------------------------------------

    @property
    def queue(self) -> str:
        """Return the queue the job goes to (``HOPPER["DEFAULT_QUEUE"]`` if it names none)."""
        if self._queue is not None:
            return self._queue
        return str(hopper_settings.DEFAULT_QUEUE)

    @property
    def max_attempts(self) -> int:
        """Return the attempts allowed (``HOPPER["DEFAULT_MAX_ATTEMPTS"]`` if not set)."""
        if self._max_attempts is not None:
            return self._max_attempts
        return int(hopper_settings.DEFAULT_MAX_ATTEMPTS)

    @property
    def is_async(self) -> bool:
        """Tell the worker to run the function on its event loop, not in a thread.

        Read once per attempt: the answer is kept, as ``func`` never changes.
        """
        cached = self.__dict__.get("_is_async")
        if cached is None:
            cached = self.__dict__["_is_async"] = inspect.iscoroutinefunction(self.func)
        return bool(cached)

    # -- options --------------------------------------------------------------

    def using(
        self,
        *,
        queue: str = _UNSET,
        priority: int = _UNSET,
        max_attempts: int = _UNSET,
        run_after: dt.datetime | dt.timedelta | None = _UNSET,
        unique_key: str | None = _UNSET,
        unique_finished: Iterable[str] = _UNSET,
        replace: bool = _UNSET,
        ordering_key: str | None = _UNSET,
        partition_key: str | None = _UNSET,
        tags: Iterable[str] = _UNSET,
        metadata: Mapping[str, Any] = _UNSET,
        ttl: dt.timedelta | float | None = _UNSET,
        awaited: bool = _UNSET,
        subject: str | None = _UNSET,
    ) -> JobFunction[P, R]:
        """Return a copy that enqueues with other options; this one is unchanged.

        ``run_after`` is an aware datetime, or a timedelta counted from the
        application's clock at enqueue (``timezone.now()``), not the
        database's: the database clock would cost a round trip per enqueue, and
        a delay is not precise to the clock skew between the two anyway. A job
        whose time has passed runs as soon as possible.

        ``unique_key``: while a live job of this kind holds the key, enqueue
        returns it (``handle.duplicate``) instead of inserting another; with
        ``unique_finished`` states, a finished job in history in one of them
        counts too. ``replace=True`` updates the existing waiting job's args,
        metadata, priority, max attempts and schedule instead of leaving it.

        ``ttl``: a job still waiting this long after enqueue is discarded.

        ``subject``: the data subject (a person, a customer: ``"user:42"``)
        whose data the job carries; ``erase_subject(subject)`` later removes
        it (docs/privacy.md). Every value is checked here and again at enqueue.
        """
        fields: dict[str, Any] = {}
        if queue is not _UNSET:
            fields["queue"] = validation.queue_name(queue)
        if priority is not _UNSET:
            fields["priority"] = validation.priority(priority)
        if max_attempts is not _UNSET:
            fields["max_attempts"] = validation.max_attempts(max_attempts)
        opts: dict[str, Any] = {}
        if run_after is not _UNSET:
            opts["run_after"] = _check_run_after(run_after)
        if unique_key is not _UNSET:
            opts["unique_key"] = validation.key(unique_key, "unique_key")
        if unique_finished is not _UNSET:
            opts["unique_finished"] = validation.unique_finished(unique_finished)
        if replace is not _UNSET:
            if not isinstance(replace, bool):
                raise InvalidJob(f"replace must be True or False, not {replace!r}", field="replace")
            opts["replace"] = replace
        if ordering_key is not _UNSET:
            opts["ordering_key"] = validation.key(ordering_key, "ordering_key")
        if partition_key is not _UNSET:
            opts["partition_key"] = validation.key(partition_key, "partition_key")
        if tags is not _UNSET:
            opts["tags"] = validation.tags(tags)
        if metadata is not _UNSET:
            opts["metadata"] = _check_metadata(metadata)
        if ttl is not _UNSET:
            opts["ttl"] = None if ttl is None else validation.positive_duration(ttl, "ttl")
        if awaited is not _UNSET:
            if not isinstance(awaited, bool):
                raise InvalidJob(f"awaited must be True or False, not {awaited!r}", field="awaited")
            opts["awaited"] = awaited
        if subject is not _UNSET:
            opts["subject"] = validation.key(subject, "subject")
        return self._copy(fields, dataclasses.replace(self.options, **opts))

    def _copy(self, changes: dict[str, Any], options: EnqueueOptions) -> JobFunction[P, R]:
        """Return a new JobFunction with some fields replaced (never registered).

        ``changes`` uses the decorator's argument names (``queue``, ``priority``,
        ``max_attempts``).
        """
        current: dict[str, Any] = {
            "kind": self.kind,
            "queue": self._queue,
            "priority": self.priority,
            "max_attempts": self._max_attempts,
            "timeout": self.timeout,
            "takes_context": self.takes_context,
            "archive": self.archive,
        }
        current.update(changes)
        return type(self)(self.func, options=options, **current)

    def _overrides(self) -> dict[str, Any]:
        """Return what distinguishes this copy from the registered job (for pickling)."""
        return {
            "queue": self._queue,
            "priority": self.priority,
            "max_attempts": self._max_attempts,
            "options": self.options,
        }

    # -- enqueue --------------------------------------------------------------

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """Store a job that runs ``func(*args, **kwargs)`` on a worker; return its handle.

        Inside ``transaction.atomic()`` the job commits or rolls back with the
        caller's other writes: a worker never sees a job whose transaction
        rolled back.
        """
        return _insert([(self, self.insert_params(args, kwargs))])[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle:
        """Enqueue from async code; the insert runs in Django's sync thread."""
        return await sync_to_async(self.enqueue)(*args, **kwargs)

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> PreparedJob:
        """Describe one job without writing it, for :func:`enqueue_many`.

        The result holds this function (with its ``using(...)`` options) and
        the arguments, checked now as ``enqueue`` would check them, so a bad
        call fails where it is made rather than in the middle of a bulk enqueue.
        """
        return PreparedJob(self, args, kwargs)

    def enqueue_many(self, items: Iterable[BatchItem | PreparedJob]) -> list[JobHandle]:
        """Enqueue many jobs in as few statements as possible; return handles in input order.

        Each item is a dict of keyword arguments or an ``(args, kwargs)`` pair,
        which get this function's options, or a ``prepare``-d call of this same
        job (its kind), which keeps its own options: one call can give each job
        its own unique key, schedule, tags... (for several kinds at once, use
        :func:`django_hopper.enqueue_many`). Every item is checked before
        anything is written, so an invalid item leaves the batch unwritten.
        Items sharing a unique key: the first is inserted (or is a duplicate of
        the job holding the key), the later ones are returned as its duplicates.
        """
        now = timezone.now()
        template: JobInsertParams | None = None
        entries: list[_Entry] = []
        for i, item in enumerate(items):
            if isinstance(item, PreparedJob):
                if item.function.kind != self.kind:
                    raise InvalidJob(
                        f"items[{i}] is a prepared {item.function.kind} job, not {self.kind}; "
                        "enqueue several kinds with django_hopper.enqueue_many",
                        field=f"items[{i}]",
                    )
                entries.append(item._entry(f"items[{i}]", now))
                continue
            if isinstance(item, Mapping):
                args: Sequence[Any] = ()
                kwargs: Mapping[str, Any] = item
            elif (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], list | tuple)
                and isinstance(item[1], Mapping)
            ):
                args, kwargs = item
            else:
                raise InvalidJob(
                    f"items[{i}] must be a dict of keyword arguments, an (args, kwargs) "
                    f"pair or a prepared call ({self.kind}.prepare(...)), not {item!r}",
                    field=f"items[{i}]",
                )
            if template is None:
                template = self._template(now)
            entries.append((self, self._with_args(template, args, kwargs, f"items[{i}].")))
        if not entries:
            return []
        return _insert(entries)

    async def aenqueue_many(self, items: Iterable[BatchItem | PreparedJob]) -> list[JobHandle]:
        """Enqueue many jobs from async code (see ``enqueue_many``)."""
        return await sync_to_async(self.enqueue_many)(list(items))

    def insert_params(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], *, field: str = ""
    ) -> JobInsertParams:
        """Return the checked engine params of one call (nothing is written).

        ``field`` prefixes the names in errors (``items[3].kwargs['x']``).
        Exposed for code that inserts jobs through the engine itself (batches,
        workflows), so that it stores exactly what ``enqueue`` would.
        """
        return self._template(call=(args, kwargs, field))

    def _template(
        self,
        now: dt.datetime | None = None,
        call: tuple[Sequence[Any], Mapping[str, Any], str] | None = None,
    ) -> JobInsertParams:
        """Return the params every job of one enqueue call shares, checked once.

        A ``run_after`` timedelta is resolved here, from ``now`` (default: the
        current time), so the jobs of one call share their schedule.
        ``call``: one call's ``(args, kwargs, field)``, for a single job: its
        arguments are checked after the options (as ``_with_args`` checks
        them after the template) and the params built at once, not copied.
        """
        opts = self.options
        scheduled_at: dt.datetime | None = None
        if isinstance(opts.run_after, dt.timedelta):
            if now is None:
                now = timezone.now()
            scheduled_at = now + opts.run_after
        elif opts.run_after is not None:
            scheduled_at = opts.run_after
        return _engine_layer().make_params(
            kind=self.kind,
            queue=validation.queue_name(self.queue),
            priority=validation.priority(self.priority),
            max_attempts=validation.max_attempts(self.max_attempts),
            scheduled_at=scheduled_at,
            metadata=opts.metadata,
            tags=opts.tags,
            unique_key=opts.unique_key,
            unique_finished=opts.unique_finished,
            ordering_key=opts.ordering_key,
            partition_key=opts.partition_key,
            subject=opts.subject,
            ttl=opts.ttl,
            awaited=opts.awaited,
            args={} if call is None else _stored_args(*call),  # evaluated last
        )

    @staticmethod
    def _with_args(
        template: JobInsertParams, args: Sequence[Any], kwargs: Mapping[str, Any], field: str
    ) -> JobInsertParams:
        """Return ``template`` carrying one call's arguments, refusing non-JSON ones."""
        return dataclasses.replace(template, args=_stored_args(args, kwargs, field))


def _stored_args(args: Sequence[Any], kwargs: Mapping[str, Any], field: str) -> dict[str, Any]:
    """Return one call's arguments as the job stores them, refusing non-JSON ones."""
    return {
        "args": validation.json_normalize(list(args), f"{field}args"),
        "kwargs": validation.json_normalize(dict(kwargs), f"{field}kwargs"),
    }


#: One job ready for ``_insert``: the function that enqueues it (the signal's
#: sender; its ``options.replace`` picks the conflict action) and its checked params.
_Entry: TypeAlias = "tuple[JobFunction[Any, Any], JobInsertParams]"


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedJob:
    """One job described but not written: a job function, its options and arguments.

    Made by ``fn.prepare(*args, **kwargs)`` (or ``fn.using(...).prepare(...)``)
    and enqueued, with others of any kind and options, by
    :func:`django_hopper.enqueue_many`, ``fn.enqueue_many``, ``Workflow.add``
    or ``Batch.add``. Checked when made, with the errors ``enqueue`` raises,
    and immutable: the arguments are stored as their JSON form (tuples become
    lists), copied from what the caller passed.
    """

    #: The job function, a ``using(...)`` copy carrying the options if any.
    function: JobFunction[Any, Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check and freeze the call, so that a prepared job can always be enqueued."""
        if not isinstance(self.function, JobFunction):
            raise InvalidJob(
                f"function must be a @job function (or its .using(...) copy), "
                f"not {self.function!r}",
                field="function",
            )
        if not isinstance(self.args, list | tuple):
            raise InvalidJob(f"args must be a list or tuple, not {self.args!r}", field="args")
        if not isinstance(self.kwargs, Mapping):
            raise InvalidJob(f"kwargs must be a dict, not {self.kwargs!r}", field="kwargs")
        args = validation.json_normalize(list(self.args), "args")
        kwargs = validation.json_normalize(dict(self.kwargs), "kwargs")
        # The options read at enqueue (settings defaults, priority range) are
        # checked now too.
        self.function._template()
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "kwargs", types.MappingProxyType(kwargs))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle through the constructor (the kwargs proxy itself does not pickle)."""
        return (type(self), (self.function, self.args, dict(self.kwargs)))

    def __repr__(self) -> str:
        call = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"<PreparedJob {self.function.kind}({', '.join(call)})>"

    def insert_params(self, *, now: dt.datetime | None = None, field: str = "") -> JobInsertParams:
        """Return the engine params of this job (nothing is written).

        ``now`` anchors a ``run_after`` timedelta (default: the current time);
        ``field`` prefixes the field named by an error, for the options read
        from the settings, which may have changed since the job was prepared.
        """
        try:
            template = self.function._template(now)
        except InvalidJob as exc:
            if not field:
                raise
            raise _in_item(exc, field) from exc
        stored = {"args": list(self.args), "kwargs": dict(self.kwargs)}
        return dataclasses.replace(template, args=stored)

    def _entry(self, field: str, now: dt.datetime | None = None) -> _Entry:
        """Return this job as ``_insert`` takes it: its sender and its params."""
        return (self.function, self.insert_params(now=now, field=field))


def _in_item(exc: InvalidJob, field: str) -> InvalidJob:
    """Return ``exc`` (same class) naming the item it came from: ``items[3].queue``."""
    inner = f"{field}.{exc.field}" if exc.field else field
    return type(exc)(f"{field}: {exc}", field=inner)


def enqueue_many(calls: Iterable[PreparedJob]) -> list[JobHandle]:
    """Enqueue prepared jobs of any kinds and options together; return handles in input order.

    ::

        django_hopper.enqueue_many(
            [send_email.using(unique_key=f"welcome-{u.pk}").prepare(u.pk) for u in users]
            + [audit.using(priority=-5, tags=["signup"]).prepare(len(users))]
        )

    Every item is checked before anything is written: an invalid item raises
    InvalidJob naming it (``items[3]...``) and nothing is inserted. The jobs
    are inserted inside the caller's transaction in as few statements as the
    engine allows (one per group: COPY for jobs without a unique key where
    the engine has it, one multi-row insert for the unique ones, one for those
    with ``replace=True``), atomically.

    An item whose unique key a live job holds (or, with ``unique_finished``, a
    job in history) returns that job with ``duplicate=True``; ``replace=True``
    updates it first. Items of one call sharing a kind and unique key are
    settled in input order: the first is inserted (or replaces), the later ones
    are returned as its duplicates and change nothing. A ``run_after``
    timedelta counts from one moment for the whole call.

    ``job_enqueued`` is sent once per distinct job function among the items
    (a ``using(...)`` copy is its own sender, as with ``enqueue``), after the
    insert.
    """
    now = timezone.now()
    entries: list[_Entry] = []
    for i, call in enumerate(calls):
        if not isinstance(call, PreparedJob):
            raise InvalidJob(
                f"items[{i}] must be a prepared job (fn.prepare(...) or "
                f"fn.using(...).prepare(...)), not {call!r}",
                field=f"items[{i}]",
            )
        entries.append(call._entry(f"items[{i}]", now))
    if not entries:
        return []
    return _insert(entries)


async def aenqueue_many(calls: Iterable[PreparedJob]) -> list[JobHandle]:
    """Enqueue prepared jobs from async code (see :func:`enqueue_many`)."""
    return await sync_to_async(enqueue_many)(list(calls))


def _insert(entries: Sequence[_Entry]) -> list[JobHandle]:
    """Insert checked jobs on the database of each one's queue (``HOPPER["QUEUE_DATABASES"]``).

    A job joins the transaction of its queue's alias. Jobs for queues on
    several aliases are written per alias, each alias's part atomic on its own.
    """
    get_engine = _engine_layer().get_engine
    if len(entries) == 1:  # every enqueue(): one job, one alias
        return _insert_on(get_engine(queue_alias(entries[0][1].queue)), entries)
    by_alias: dict[str, list[int]] = {}
    for i, (_, p) in enumerate(entries):
        by_alias.setdefault(queue_alias(p.queue), []).append(i)
    if len(by_alias) == 1:
        return _insert_on(get_engine(next(iter(by_alias))), entries)
    handles: list[JobHandle | None] = [None] * len(entries)
    for alias, indexes in by_alias.items():
        done = _insert_on(get_engine(alias), [entries[i] for i in indexes])
        for i, handle in zip(indexes, done, strict=True):
            handles[i] = handle
    return [h for h in handles if h is not None]


def _insert_on(engine: BaseEngine, entries: Sequence[_Entry]) -> list[JobHandle]:
    """Insert checked jobs, grouped by how the engine takes them; send ``job_enqueued``.

    The engine expects its inputs deduplicated by unique key and takes one
    conflict action per call, so the jobs are split into: later items
    repeating an earlier (kind, unique key), answered from that item's
    result; jobs without a unique key (one COPY where the engine has it);
    unique jobs that skip; unique jobs that replace. With more than one
    group, the groups are written in one atomic block, and the IDs are made
    here in input order, as ID order is creation order.
    """
    layer = _engine_layer()
    skip_opts = layer.skip_opts
    if len(entries) == 1 and entries[0][1].unique_key is None:
        # One job without a unique key (every plain enqueue()): one insert, what
        # the general path below does for it, without its grouping.
        fn, params_one = entries[0]
        if signals.job_enqueuing.receivers:
            params_one = signals.enqueuing(fn, [params_one])[0]
            one = engine.job_insert_many([params_one], skip_opts)[0]
            handle = JobHandle(one.job, duplicate=one.duplicate, alias=engine.alias)
        else:
            # The params were built for this call and nobody else holds them:
            # the ID is made here, so the handle needs no row to know it, and
            # the row is built only if the caller reads it.
            if params_one.id is None:
                params_one.id = new_id()
            one = engine.job_insert_many([params_one], skip_opts)[0]
            handle = JobHandle._inserted(one, params_one.id, params_one.kind, engine.alias)
        if job_enqueued.receivers:
            job_enqueued.send(sender=fn, jobs=[handle.job], duplicates=[])
        return [handle]
    plain: list[int] = []
    skip: list[int] = []
    replace: list[int] = []
    first: dict[tuple[str, str], int] = {}
    repeats: dict[int, int] = {}
    for i, (fn, p) in enumerate(entries):
        if p.unique_key is None:
            plain.append(i)
            continue
        j = first.setdefault((p.kind, p.unique_key), i)
        if j != i:
            repeats[i] = j
        elif fn.options.replace:
            replace.append(i)
        else:
            skip.append(i)
    use_copy = engine.features.supports_copy and len(plain) > 1
    if plain and not use_copy:
        # One multi-row statement takes plain and unique jobs alike.
        skip = sorted(plain + skip) if skip else plain
        plain = []
    replace_opts = layer.make_opts(notify=True, on_conflict=ConflictAction.REPLACE)
    groups = [
        (group, insert, opts)
        for group, insert, opts in (
            (plain, engine.job_insert_copy, skip_opts),
            (skip, engine.job_insert_many, skip_opts),
            (replace, engine.job_insert_many, replace_opts),
        )
        if group
    ]
    params = [p for _, p in entries]
    if signals.job_enqueuing.receivers:
        senders = {id(fn): fn for fn, _ in entries}
        params = signals.enqueuing(
            next(iter(senders.values())) if len(senders) == 1 else None, params
        )
    results: list[JobInsertResult | None] = [None] * len(entries)
    if len(groups) == 1:
        group, insert, opts = groups[0]
        for i, result in zip(group, insert([params[i] for i in group], opts), strict=True):
            results[i] = result
    else:
        written = sorted(i for group, _, _ in groups for i in group)
        for i, job_id in zip(written, new_ids(len(written)), strict=True):
            if params[i].id is None:
                params[i] = dataclasses.replace(params[i], id=job_id)
        with transaction.atomic(using=engine.alias):
            for group, insert, opts in groups:
                inserted = insert([params[i] for i in group], opts)
                for i, result in zip(group, inserted, strict=True):
                    results[i] = result
    for i, j in repeats.items():
        held = results[j]
        assert held is not None
        results[i] = layer.make_result(job=held.job, duplicate=True)
    alias = engine.alias
    handles: list[JobHandle] = []
    for settled in results:
        assert settled is not None
        handles.append(JobHandle(settled.job, duplicate=settled.duplicate, alias=alias))
    if not job_enqueued.receivers:  # nobody listens: build nothing to send
        return handles
    by_sender: dict[int, tuple[JobFunction[Any, Any], list[JobRow], list[JobRow]]] = {}
    for (fn, _), handle in zip(entries, handles, strict=True):
        sent = by_sender.get(id(fn))
        if sent is None:
            sent = by_sender[id(fn)] = (fn, [], [])
        (sent[2] if handle.duplicate else sent[1]).append(handle.job)
    for fn, jobs, duplicates in by_sender.values():
        job_enqueued.send(sender=fn, jobs=jobs, duplicates=duplicates)
    return handles


class _EngineLayer(NamedTuple):
    """What the enqueue API uses of the engine layer, imported on the first enqueue."""

    get_engine: Callable[[str | None], BaseEngine]
    make_params: type[JobInsertParams]
    make_opts: type[JobInsertOpts]
    make_result: type[JobInsertResult]
    #: The insert options of an enqueue without ``replace`` (immutable, made once).
    skip_opts: JobInsertOpts


@functools.cache
def _engine_layer() -> _EngineLayer:
    """Import the engine layer once and return what the enqueue API uses of it.

    Importing the public API (``from django_hopper import job``) must not load
    the engine layer, which needs settings; an ``import`` statement run on
    every enqueue instead cost about a microsecond each (Python looks the
    module's spec up again), and an enqueue ran three.
    """
    from django_hopper.engine import get_engine  # noqa: PLC0415 - keeps `from django_hopper import job` from loading the engine
    from django_hopper.engine.params import (  # noqa: PLC0415 - keeps `from django_hopper import job` from loading the engine
        JobInsertOpts,
        JobInsertParams,
        JobInsertResult,
    )

    return _EngineLayer(
        get_engine,
        JobInsertParams,
        JobInsertOpts,
        JobInsertResult,
        JobInsertOpts(notify=True, on_conflict=ConflictAction.SKIP),
    )


def _rebuild(kind: str, overrides: dict[str, Any]) -> JobFunction[Any, Any]:
    """Unpickle a ``using(...)`` copy: the registered job with its overrides."""
    changes = dict(overrides)
    options = changes.pop("options")
    return resolve(kind)._copy(changes, options)


# ---------------------------------------------------------------------------
# The decorator


@overload
def job(func: Callable[P, R], /) -> JobFunction[P, R]: ...


@overload
def job(
    *,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout: float | dt.timedelta | None = None,
    takes_context: bool = False,
    archive: bool | None = None,
    kind: str | None = None,
) -> Callable[[Callable[P, R]], JobFunction[P, R]]: ...


def job(
    func: Callable[P, R] | None = None,
    /,
    *,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout: float | dt.timedelta | None = None,
    takes_context: bool = False,
    archive: bool | None = None,
    kind: str | None = None,
) -> JobFunction[P, R] | Callable[[Callable[P, R]], JobFunction[P, R]]:
    """Make a function a job: ``@job`` or ``@job(queue=..., ...)``.

    ``queue`` and ``max_attempts`` default to ``HOPPER["DEFAULT_QUEUE"]`` and
    ``HOPPER["DEFAULT_MAX_ATTEMPTS"]``, read at enqueue, so decorating never
    reads settings. ``timeout`` (seconds) bounds one attempt. With
    ``takes_context`` the worker passes the job context as the first
    argument. ``archive=False`` drops the job when it completes instead of
    keeping it in history. ``kind`` overrides the name the job is stored
    under (default: the function's import path); a worker must then import
    the defining module (``HOPPER["IMPORTS"]``) for the name to resolve.
    """
    if queue is not None:
        validation.queue_name(queue)
    if max_attempts is not None:
        validation.max_attempts(max_attempts)
    validation.priority(priority)
    timeout_s = _check_timeout(timeout)
    if not isinstance(takes_context, bool):
        raise InvalidJob(
            f"takes_context must be True or False, not {takes_context!r}", field="takes_context"
        )
    if archive is not None and not isinstance(archive, bool):
        raise InvalidJob(f"archive must be True, False or None, not {archive!r}", field="archive")

    def decorate(f: Callable[P, R]) -> JobFunction[P, R]:
        if isinstance(f, JobFunction):
            raise InvalidJob(f"{f.kind} is already a job", field="func")
        if not callable(f) or not hasattr(f, "__qualname__"):
            raise InvalidJob(f"@job decorates functions, not {f!r}", field="func")
        name = kind if kind is not None else _importable_kind(f)
        validation.kind(name)
        jf = JobFunction(
            f,
            kind=name,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout_s,
            takes_context=takes_context,
            archive=archive,
        )
        register(jf)
        return jf

    if func is not None:
        return decorate(func)
    return decorate


def _importable_kind(func: Callable[..., Any]) -> str:
    """Return a function's import path; refuse functions a worker could never import."""
    module = getattr(func, "__module__", None)
    qualname = func.__qualname__
    if not module or module == "__main__":
        raise InvalidJob(
            f"@job cannot be used on {qualname!r} in __main__: a worker imports jobs by "
            "module path, and __main__ is a different module in the worker. "
            "Move the function into an importable module.",
            field="kind",
        )
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise InvalidJob(
            f"@job cannot be used on {module}.{qualname}: it is defined inside a function "
            "(or is a lambda), so a worker could never import it. Define it at module level, "
            "or give it an explicit kind=... and register it in a module the worker imports.",
            field="kind",
        )
    return f"{module}.{qualname}"


def _check_timeout(value: float | dt.timedelta | None) -> float | None:
    """Return a timeout in seconds, or None for the setting's default."""
    if value is None:
        return None
    return validation.positive_duration(value, "timeout").total_seconds()


def _check_run_after(value: Any) -> dt.datetime | dt.timedelta | None:
    """Accept None, a timedelta (from now) or an aware datetime."""
    if value is None or isinstance(value, dt.timedelta):
        return value
    return validation.aware(value, "run_after")


def _check_metadata(value: Any) -> dict[str, Any]:
    """Accept a JSON object (metadata is filtered by containment, so it must be one)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidJob(f"metadata must be a dict, not {value!r}", field="metadata")
    normalized: dict[str, Any] = validation.json_normalize(dict(value), "metadata")
    return normalized


def _job_function_or_none(obj: object) -> JobFunction[Any, Any] | None:
    """The resolver for ``@job`` functions: the object itself when it is one."""
    return obj if isinstance(obj, JobFunction) else None


register_resolver(_job_function_or_none)

__all__ = [
    "UNKNOWN_KIND_PREFIX",
    "BatchItem",
    "EnqueueOptions",
    "JobFunction",
    "JobHandle",
    "PreparedJob",
    "aenqueue_many",
    "enqueue_many",
    "job",
    "kind_of",
    "registry",
    "resolve",
]
