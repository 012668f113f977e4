"""The leader's history and table services: retention, index builds, vacuum.

* :class:`HistoryPruner` creates history partitions ahead, drops or prunes
  what is past retention, and deletes what gone jobs left behind (every 5 min).
* :class:`HistoryIndexer` builds history indexes per partition without
  blocking, and repairs invalid indexes interrupted builds left, in a thread
  of its own (every 10 min; it can run long).
* :class:`Vacuumer` vacuums and analyzes the hot tables when they need it
  (every 30 s).

Each is safe on two leaders at once: the engine methods they call are
idempotent.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import TYPE_CHECKING

from django_hopper.conf import hopper_settings
from django_hopper.engine.params import (
    HistoryIndexParams,
    HistoryIndexResult,
    HistoryMaintainParams,
    HistoryMaintainResult,
    JobsMaintainParams,
    JobsMaintainResult,
)
from django_hopper.exceptions import HistoryIndexRepairError
from django_hopper.maintenance.base import UPKEEP_FIRST_DELAY, Service
from django_hopper.worker.db import close_thread_connections

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine

logger = logging.getLogger("django_hopper.maintenance")


class HistoryPruner(Service):
    """Keep history bounded: partitions ahead, drops and prunes past retention, and
    the batches, workflow edges and step ledgers gone jobs left behind.

    Retention comes from ``HOPPER["COMPLETED_RETENTION"]`` and
    ``["FAILED_RETENTION"]`` (seconds) unless given.
    """

    name = "history_retention"
    interval = 300.0

    def __init__(
        self,
        engine: BaseEngine,
        *,
        completed_retention: dt.timedelta | None = None,
        failed_retention: dt.timedelta | None = None,
        lock_timeout: dt.timedelta = dt.timedelta(0),
        create_ahead: int = 3,
    ) -> None:
        super().__init__(engine)
        self.completed_retention = completed_retention
        self.failed_retention = failed_retention
        self.lock_timeout = lock_timeout
        self.create_ahead = create_ahead

    def params(self, now: dt.datetime | None = None, **overrides: object) -> HistoryMaintainParams:
        """Return the params of a pass (``hopper_partitions`` overrides some)."""
        values: dict[str, object] = {
            "completed_retention": self.completed_retention
            or hopper_settings.seconds("COMPLETED_RETENTION"),
            "failed_retention": self.failed_retention
            or hopper_settings.seconds("FAILED_RETENTION"),
            "lock_timeout": self.lock_timeout,
            "create_ahead": self.create_ahead,
            "now": now,
        }
        values.update(overrides)
        return HistoryMaintainParams(**values)  # type: ignore[arg-type]

    def prune(self, now: dt.datetime | None = None) -> HistoryMaintainResult:
        """Do one retention pass and return what it did; deferred units wait for the next."""
        result = self.engine.history_maintain(self.params(now))
        if result.deferred:
            logger.info("history retention deferred %s (locked); retrying later", result.deferred)
        return result

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Do one retention pass; return how many partitions and rows it changed."""
        result = self.prune(now)
        return (
            len(result.created)
            + len(result.dropped)
            + int(result.pruned)
            + result.batches_deleted
            + result.edges_deleted
            + result.steps_deleted
        )


class HistoryIndexer(Service):
    """Build history indexes that partitions lack, and repair the invalid indexes
    interrupted concurrent builds left on hopper's tables (PostgreSQL).

    A build needs a connection outside any transaction and takes as long as
    the partitions are large, so each round runs it in a thread of its own,
    apart from the rescue and the other services; a pass still running is
    not started twice. An index whose repair failed (a unique index over
    duplicates fails every time) is left alone for ``repair_retry`` before it
    is tried again, so the pass does not rebuild it in vain every round;
    ``hopper_indexes`` tries it at once.
    """

    name = "history_index"
    interval = 600.0

    def __init__(
        self,
        engine: BaseEngine,
        params: HistoryIndexParams | None = None,
        *,
        repair_retry: dt.timedelta = dt.timedelta(hours=24),
    ) -> None:
        super().__init__(engine)
        self.params = params or HistoryIndexParams()
        self.repair_retry = repair_retry
        #: Indexes whose repair failed, by the monotonic time it did.
        self.failed_repairs: dict[str, float] = {}
        self._thread: threading.Thread | None = None

    def build(self) -> HistoryIndexResult:
        """Build the missing indexes and repair the invalid ones now, in this thread.

        Engines without concurrent builds have nothing to build or repair.
        Raises ``HistoryIndexRepairError`` (after the rest of the pass) when a
        repair failed; that index is skipped for ``repair_retry``.
        """
        now = time.monotonic()
        wait = self.repair_retry.total_seconds()
        self.failed_repairs = {k: t for k, t in self.failed_repairs.items() if now - t < wait}
        params = dataclasses.replace(
            self.params,
            skip_repair=tuple(dict.fromkeys([*self.params.skip_repair, *self.failed_repairs])),
        )
        try:
            result = self.engine.history_index(params)
        except HistoryIndexRepairError as exc:
            self.failed_repairs.update(dict.fromkeys(exc.failures, now))
            raise
        if result.repaired or result.removed:
            logger.warning(
                "history index pass repaired invalid indexes %s, dropped leftovers %s",
                result.repaired,
                result.removed,
            )
        return result

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Start a build in the background unless one is running; return 1 if started."""
        if self._thread is not None and self._thread.is_alive():
            return 0
        self._thread = threading.Thread(
            target=self._build, name="hopper-history-index", daemon=True
        )
        self._thread.start()
        return 1

    def close(self, timeout: float | None = 10.0) -> None:
        """Let a running build finish, so its connection closes before the process exits."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _build(self) -> None:
        try:
            self.build()
        except Exception:
            logger.exception("history index pass failed")
        finally:
            close_thread_connections()


class Vacuumer(Service):
    """Vacuum (PostgreSQL) and analyze the live tables when enough jobs churned
    through them or their row estimate is off (SQLite: the estimate only); it
    never waits for a lock."""

    name = "jobs_upkeep"
    interval = 30.0
    first_delay = UPKEEP_FIRST_DELAY

    def __init__(self, engine: BaseEngine, params: JobsMaintainParams | None = None) -> None:
        super().__init__(engine)
        self.params = params or JobsMaintainParams()

    def vacuum(self) -> JobsMaintainResult:
        """Do one pass and return what it did."""
        return self.engine.jobs_maintain(self.params)

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Do one pass; return how many tables were vacuumed or analyzed."""
        result = self.vacuum()
        return int(result.vacuumed) + int(result.analyzed)
