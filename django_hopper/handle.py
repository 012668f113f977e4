"""What ``enqueue`` returns: :class:`JobHandle`, to read the job again or wait for it."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async

from django_hopper.exceptions import HopperError, JobFailed, NotFound
from django_hopper.types import CHANNEL_DONE, JobRow

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine, Listener
    from django_hopper.engine.params import JobInsertResult


class JobHandle:
    """What ``enqueue`` returns: the job's ID and the row as inserted.

    ``duplicate`` is True when a job with the same unique key already existed;
    ``id`` and ``job`` are then that job's. ``refresh()`` reads the job again
    (live or history); a way to await the result can build on the stored alias
    and ``refresh()``.

    The row of a job ``enqueue()`` inserted is built when ``job`` is first
    read (the same row, from the values the insert sent and returned); ``id``,
    ``kind`` and ``duplicate`` never need it.
    """

    __slots__ = ("_alias", "_id", "_job", "_kind", "_result", "duplicate")

    def __init__(self, job: JobRow, *, duplicate: bool = False, alias: str | None = None) -> None:
        self._job: JobRow | None = job
        self._result: JobInsertResult | None = None
        self._id = job.id
        self._kind = job.kind
        self.duplicate = duplicate
        self._alias = alias

    @classmethod
    def _inserted(
        cls, result: JobInsertResult, job_id: uuid.UUID, kind: str, alias: str | None
    ) -> JobHandle:
        """Return the handle of a job just inserted as ``job_id``.

        Its row is read from ``result`` when first needed.
        """
        handle = cls.__new__(cls)
        handle._job = None
        handle._result = result
        handle._id = job_id
        handle._kind = kind
        handle.duplicate = result.duplicate
        handle._alias = alias
        return handle

    def __repr__(self) -> str:
        dup = " duplicate" if self.duplicate else ""
        return f"<JobHandle {self.kind} {self.id} {self.job.state}{dup}>"

    @property
    def job(self) -> JobRow:
        """The job's row: as inserted (or found, for a duplicate), or as ``refresh()`` read it."""
        job = self._job
        if job is None:
            assert self._result is not None
            job = self._job = self._result.job
            self._result = None
        return job

    @job.setter
    def job(self, row: JobRow) -> None:
        self._job = row
        self._result = None

    @property
    def id(self) -> uuid.UUID:
        return self._id

    @property
    def kind(self) -> str:
        return self._kind

    def _engine(self) -> BaseEngine:
        # Imported here: importing the public API (``from django_hopper import job``)
        # must not load the engine layer, which needs settings.
        from django_hopper.engine import get_engine  # noqa: PLC0415 - keeps `from django_hopper import job` from loading the engine

        return get_engine(self._alias)

    def refresh(self) -> JobRow:
        """Read the job again, update ``job`` and return it; NotFound if it was deleted.

        Inside the enqueueing transaction it reads that transaction's view; a
        job whose transaction rolled back is not found.
        """
        row = self._engine().job_get(self.id)
        if row is None:
            raise NotFound(f"job {self.id} ({self.kind}) does not exist")
        self.job = row
        return row

    async def arefresh(self) -> JobRow:
        """Async twin of ``refresh``."""
        return await sync_to_async(self.refresh)()

    @property
    def state(self) -> str:
        """Return the job's current state (reads the database)."""
        return self.refresh().state

    def wait(self, timeout: float | None = None, *, poll_interval: float = 0.5) -> JobRow:
        """Block until the job finishes; return it completed, with its output.

        Raises JobFailed (with ``.job``) if it ends canceled or discarded, and
        TimeoutError after ``timeout`` seconds. A job enqueued with
        ``.using(awaited=True)`` wakes the waiter through the done notification
        where the engine has them (``features.supports_listen``); otherwise, and
        as a fallback, the job is polled every ``poll_interval`` seconds. Works
        from any process. Call it outside the enqueueing transaction, which
        must commit before a worker can see the job.
        """
        engine = self._engine()
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        listener: Listener | None = None
        if engine.features.supports_listen and self.job.awaited:
            try:
                listener = engine.listener()
                listener.listen([CHANNEL_DONE])
            except HopperError:
                listener = None  # poll instead
        try:
            while True:
                try:
                    row = self.refresh()
                except NotFound:
                    raise NotFound(
                        f"job {self.id} ({self.kind}) is gone: deleted, or completed without "
                        "a history row (archive off)"
                    ) from None
                if row.finalized_at is not None:
                    if row.state == "completed":
                        return row
                    error = row.errors[-1].error if row.errors else ""
                    raise JobFailed(f"job {self.id} ({self.kind}) {row.state}: {error}", job=row)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"job {self.id} ({self.kind}) still {row.state}")
                step = poll_interval if left is None else min(left, poll_interval)
                if listener is not None:
                    # The notification wakes us early; the poll is the fallback.
                    listener.next(step * 10 if left is None else min(left, step * 10))
                else:
                    time.sleep(step)
        finally:
            if listener is not None:
                listener.close()

    async def await_result(
        self, timeout: float | None = None, *, poll_interval: float = 0.5
    ) -> JobRow:
        """Async twin of ``wait`` (the wait runs in a worker thread)."""
        return await sync_to_async(self.wait, thread_sensitive=False)(
            timeout, poll_interval=poll_interval
        )
