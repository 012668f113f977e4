"""Batches: a group of jobs with callbacks that run once the last one finishes.

::

    batch = Batch(metadata={"import": 42})
    for page in pages:
        batch.add(fetch_page, page)
    batch.on_success(notify, "all pages fetched")
    batch.on_failure(alert, "some pages failed")
    handle = batch.enqueue()        # atomically, inside the caller's transaction
    handle.refresh().pending

A job's finish is recorded by the statement that finalizes it; the worker that
finalized it settles the batch right after (``worker.completer.settle_finished``),
and the leader sweeps the rest (``maintenance.WorkflowSweeper``), so
each callback is inserted exactly once, whichever jobs finish last and together.
Each callback's metadata carries ``batch_id``.

A job with a unique key that an existing job holds is not inserted (its
handle is the existing job's, ``duplicate``) and still counts toward the
batch: a job in history counts at once (failed if it was canceled or
discarded), a waiting job of no batch joins this one, and a running job or
another batch's counts at once as done (docs/workflows.md, "Batches").
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from django_hopper import signals, topology
from django_hopper.api import parse_job_id
from django_hopper.engine import get_engine
from django_hopper.engine.params import BatchInsertParams, JobInsertOpts
from django_hopper.exceptions import InvalidJob, NotFound
from django_hopper.jobs import JobFunction, JobHandle, PreparedJob, resolve
from django_hopper.validation import json_normalize

if TYPE_CHECKING:
    from django_hopper.engine.params import JobInsertParams
    from django_hopper.jobs import JobFunction, JobHandle, PreparedJob
    from django_hopper.types import BatchRow

__all__ = ["Batch", "BatchHandle", "get_batch"]


def call_params(
    fn: JobFunction[Any, Any] | PreparedJob | str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    field: str,
) -> JobInsertParams:
    """Return the checked insert params of one call of a job function (or its kind).

    A prepared job (``fn.prepare(...)``) carries its own arguments, so it takes
    no others: both ways of describing a job are accepted wherever one is added.
    """

    if isinstance(fn, PreparedJob):
        if args or kwargs:
            raise InvalidJob(
                f"{field} is a prepared job, which carries its arguments; it takes no "
                f"others (got {tuple(args)!r}, {dict(kwargs)!r})",
                field=field,
            )
        return fn.insert_params(field=field)
    if isinstance(fn, str):
        fn = resolve(fn)
    if not isinstance(fn, JobFunction):
        raise InvalidJob(
            f"{field} must be a @job function (or its .using(...) copy or a prepared "
            f"job), not {fn!r}",
            field=field,
        )
    return fn.insert_params(args, kwargs, field=f"{field}.")


class BatchHandle:
    """What ``Batch.enqueue`` returns: the batch's ID and its jobs' handles."""

    def __init__(self, id: uuid.UUID, jobs: list[JobHandle], alias: str | None = None) -> None:
        self.id = id
        self.jobs = jobs
        self._alias = alias

    def refresh(self) -> BatchRow:
        """Read the batch's progress (pending, failed, completed_at)."""
        return get_batch(self.id, alias=self._alias)

    def __repr__(self) -> str:
        return f"<BatchHandle {self.id} ({len(self.jobs)} jobs)>"


class Batch:
    """A batch of jobs under construction; nothing is written before ``enqueue``."""

    def __init__(self, *, metadata: Mapping[str, Any] | None = None) -> None:
        self.metadata = dict(metadata or {})
        self._calls: list[JobInsertParams] = []
        self._callbacks: dict[str, JobInsertParams] = {}
        self._keys: dict[tuple[str, str], int] = {}

    def add(
        self, fn: JobFunction[Any, Any] | PreparedJob | str, /, *args: Any, **kwargs: Any
    ) -> None:
        """Add one job (checked now, written at ``enqueue``).

        ``fn`` is a job function with its arguments, or a prepared job
        (``fn.using(...).prepare(...)``), which carries its own.
        """
        index = len(self._calls)
        params = call_params(fn, args, kwargs, f"jobs[{index}]")
        if params.unique_key is not None:
            key = (params.kind, params.unique_key)
            first = self._keys.setdefault(key, index)
            if first != index:
                raise InvalidJob(
                    f"jobs[{index}] repeats the unique key {params.unique_key!r} of "
                    f"jobs[{first}] ({params.kind}): one batch holds a key once",
                    field="unique_key",
                )
        self._calls.append(params)

    def add_many(self, fn: JobFunction[Any, Any] | str, items: Iterable[Mapping[str, Any]]) -> None:
        """Add one job per dict of keyword arguments."""
        for kwargs in items:
            self.add(fn, **kwargs)

    def _callback(
        self, which: str, fn: JobFunction[Any, Any] | PreparedJob | str, args: Any, kw: Any
    ) -> None:
        self._callbacks[which] = call_params(fn, args, kw, which)

    def on_success(
        self, fn: JobFunction[Any, Any] | PreparedJob | str, /, *args: Any, **kwargs: Any
    ) -> None:
        """Run ``fn`` once every job completed (none canceled or discarded)."""
        self._callback("on_success", fn, args, kwargs)

    def on_failure(
        self, fn: JobFunction[Any, Any] | PreparedJob | str, /, *args: Any, **kwargs: Any
    ) -> None:
        """Run ``fn`` once every job finished and at least one was canceled or discarded."""
        self._callback("on_failure", fn, args, kwargs)

    def on_complete(
        self, fn: JobFunction[Any, Any] | PreparedJob | str, /, *args: Any, **kwargs: Any
    ) -> None:
        """Run ``fn`` once every job finished, whatever their outcome."""
        self._callback("on_complete", fn, args, kwargs)

    def enqueue(self) -> BatchHandle:
        """Write the batch and its jobs atomically (inside the caller's transaction)."""

        if not self._calls:
            raise InvalidJob("a batch needs at least one job", field="jobs")
        metadata = json_normalize(self.metadata, "metadata")
        queues = [p.queue for p in self._calls]
        queues += [c.queue for c in self._callbacks.values()]
        engine = get_engine(topology.single_alias(queues, "a batch"))
        with transaction.atomic(using=engine.alias):
            batch_id = engine.batch_insert(
                BatchInsertParams(
                    total=len(self._calls),
                    on_success=self._callbacks.get("on_success"),
                    on_failure=self._callbacks.get("on_failure"),
                    on_complete=self._callbacks.get("on_complete"),
                    metadata=metadata,
                )
            )
            params = [dataclasses.replace(p, batch_id=batch_id) for p in self._calls]
            params = signals.enqueuing(None, params)
            results = engine.job_insert_many(params, JobInsertOpts(notify=True))
            if signals.job_enqueued.receivers:
                signals.job_enqueued.send(
                    sender=None,
                    jobs=[r.job for r in results if not r.duplicate],
                    duplicates=[r.job for r in results if r.duplicate],
                )
        handles = [JobHandle(r.job, duplicate=r.duplicate, alias=engine.alias) for r in results]
        return BatchHandle(batch_id, handles, alias=engine.alias)


def get_batch(batch_id: uuid.UUID | str, *, alias: str | None = None) -> BatchRow:
    """Return a batch's progress; raise NotFound if there is none."""

    bid = parse_job_id(batch_id, "batch_id")
    row = get_engine(alias).batch_get(bid)
    if row is None:
        raise NotFound(f"batch {bid} does not exist")
    return row
