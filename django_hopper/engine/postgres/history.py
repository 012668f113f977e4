"""History retention and partitions, history indexes and live-table upkeep on
PostgreSQL (``history_maintain``, ``history_index``, ``jobs_maintain``).

Design (docs/periodic-and-retention.md says it for operators):

* History is range-partitioned by ``finalized_at`` into UTC days named
  ``hopper_job_history_pYYYYMMDD``, plus the DEFAULT partition the migration
  creates. Days from today to ``create_ahead`` days ahead are created; a day
  whose rows already sit in DEFAULT (the first pass after installing, or a
  leader that was down) is created as a table, filled with those rows and
  attached, in one transaction.
* Completed and failed jobs share partitions but not retention. A day is
  dropped once it is past the *shorter* retention, if at most ``move_limit`` of
  its rows are still within their own (longer) one: those move to DEFAULT in
  the drop's transaction, and are deleted individually later. A day with more
  is *kept* until it is past the longer retention; its expired rows are then
  deleted individually (``pruned``), in bounded chunks, as are DEFAULT's.
* Every creation and drop runs in its own transaction under a short
  ``lock_timeout``: a unit a long transaction holds off is *deferred* to the
  next pass, never waited on, so finalizes never queue behind it for long.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import Error as DjangoDatabaseError
from django.db import transaction

from django_hopper.engine.params import (
    HistoryIndexDeclareParams,
    HistoryIndexParams,
    HistoryIndexResult,
    HistoryMaintainParams,
    HistoryMaintainResult,
    JobsMaintainParams,
    JobsMaintainResult,
)
from django_hopper.engine.postgres.periodic import PostgresPeriodicMixin
from django_hopper.engine.postgres.support import (
    LOCK_NOT_AVAILABLE,
    QUERIES,
    PostgresSupport,
    _sqlstate,
    db_errors,
)
from django_hopper.engine.rules import HOT_TABLES, upkeep_action
from django_hopper.exceptions import DatabaseError
from django_hopper.types import HistoryPartitionRow

UTC = dt.UTC
DAY = dt.timedelta(days=1)
PARTITION_PREFIX = "hopper_job_history_p"
_PARTITION_NAME = re.compile(r"hopper_job_history_p(\d{8})")
#: The default lock timeout of DDL on history and of upkeep.
DEFAULT_LOCK_TIMEOUT = dt.timedelta(milliseconds=100)

QUERY_CANCELED = "57014"
DUPLICATE_TABLE = "42P07"
#: A new partition's range has rows in DEFAULT.
CHECK_VIOLATION = "23514"
UNDEFINED_TABLE = "42P01"
UNDEFINED_OBJECT = "42704"


def partition_name(day: dt.datetime) -> str:
    """Return the name of the partition of the UTC day starting at ``day``."""
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def partition_range(name: str) -> tuple[dt.datetime, dt.datetime] | None:
    """Return the day range of a partition hopper named, None for any other."""
    m = _PARTITION_NAME.fullmatch(name)
    if m is None:
        return None
    lower = dt.datetime.strptime(m.group(1), "%Y%m%d").replace(tzinfo=UTC)
    return lower, lower + DAY


def start_of_day(value: dt.datetime) -> dt.datetime:
    """Return the start of the UTC day of ``value``."""
    return value.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def index_name(partition: str, parent_index: str) -> str:
    """Return the name of a partition's copy of a parent index (at most 63 bytes)."""
    name = f"{partition}_{parent_index}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[:52]}_{digest}"


def _ms(value: dt.timedelta, default: dt.timedelta) -> str:
    """Return a PostgreSQL duration setting in whole milliseconds (at least 1)."""
    value = value if value > dt.timedelta(0) else default
    return f"{max(1, int(value / dt.timedelta(milliseconds=1)))}ms"


class PostgresHistoryMixin(PostgresSupport):
    """``history_*`` and ``jobs_maintain`` of the PostgreSQL engine."""

    # -- helpers ------------------------------------------------------------

    def _run_text(self, builder: str, params: Mapping[str, Any]) -> None:
        """Build a DDL statement with a ``*_sql`` query and run it, untranslated.

        Callers handle lock and timeout errors themselves, so driver errors
        pass through here.
        """
        with self.connection.cursor() as cursor:
            cursor.execute(QUERIES[builder], params)
            (statement,) = cursor.fetchone()
            cursor.execute(statement)

    def _raw_one(self, name: str, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """Run a named query and return its row, untranslated (inside a unit)."""
        with self.connection.cursor() as cursor:
            cursor.execute(QUERIES[name], params)
            return cursor.fetchone()  # type: ignore[no-any-return]

    @contextmanager
    def _unit(self, lock_timeout: str) -> Iterator[None]:
        """Run one unit of DDL in its own transaction (or savepoint) with a lock timeout."""
        with transaction.atomic(using=self.alias):
            with self.connection.cursor() as cursor:
                cursor.execute(QUERIES["history_maintain"], {"value": lock_timeout})
            yield

    # -- partitions ---------------------------------------------------------

    def _history_partitions(self) -> list[HistoryPartitionRow]:
        """List history's partitions, hopper's days with their range."""
        out = []
        for name, bound, estimate, is_default in self._fetchall("history_partitions", {}):
            day = partition_range(name)
            out.append(
                HistoryPartitionRow(
                    name=name,
                    lower=day[0] if day else None,
                    upper=day[1] if day else None,
                    rows_estimate=int(estimate),
                    is_default=bool(is_default),
                    bound=bound or "",
                )
            )
        return out

    def _history_maintain(self, params: HistoryMaintainParams) -> HistoryMaintainResult:
        """Create days ahead, drop days past retention, prune the rest in chunks."""
        now = params.now or self.now()
        lock = _ms(params.lock_timeout, DEFAULT_LOCK_TIMEOUT)
        result = HistoryMaintainResult()
        parts = self.history_partitions()
        if params.create:
            self._create_ahead(now, params, lock, {p.name for p in parts}, result)
        if params.drop:
            self._drop_expired(now, params, lock, parts, result)
        if params.prune:
            self._prune(now, params, result)
            if not params.dry_run:
                self._prune_orphans(params, result)
        return result

    def _create_ahead(
        self,
        now: dt.datetime,
        params: HistoryMaintainParams,
        lock: str,
        existing: set[str],
        result: HistoryMaintainResult,
    ) -> None:
        """Create the missing days from today to ``create_ahead`` days ahead."""
        today = start_of_day(now)
        for i in range(max(params.create_ahead, 0) + 1):
            lower = today + i * DAY
            name = partition_name(lower)
            if name in existing:
                continue
            args = {"name": name, "lower": lower, "upper": lower + DAY}
            if self._raw_one("history_maintain.default_has_rows", args)[0]:
                # The day's rows already sit in DEFAULT (a fresh install, or
                # maintenance that fell behind). Moving them into a new partition
                # would race readers: a query planned before the attach and run
                # after it looks only in DEFAULT and misses them. So the day stays
                # in DEFAULT, whose rows retention prunes one by one; the days
                # created ahead, which nothing has written yet, are partitions.
                continue
            if params.dry_run:
                result.created.append(name)
                continue
            try:
                with self._unit(lock):
                    self._run_text("history_maintain.create_sql", args)
            except DjangoDatabaseError as exc:
                state = _sqlstate(exc)
                if state in (LOCK_NOT_AVAILABLE, CHECK_VIOLATION):
                    # Locked, or a finalize wrote the day into DEFAULT meanwhile:
                    # the next pass decides again.
                    result.deferred.append(name)
                    continue
                if state == DUPLICATE_TABLE:  # another leader created it
                    continue
                raise DatabaseError(f"history_maintain: creating {name}: {exc}") from exc
            result.created.append(name)

    def _drop_expired(
        self,
        now: dt.datetime,
        params: HistoryMaintainParams,
        lock: str,
        parts: list[HistoryPartitionRow],
        result: HistoryMaintainResult,
    ) -> None:
        """Drop the days past the shorter retention whose survivors fit ``move_limit``."""
        completed_before = now - params.completed_retention
        failed_before = now - params.failed_retention
        shorter = now - min(params.completed_retention, params.failed_retention)
        longer = now - max(params.completed_retention, params.failed_retention)
        for part in parts:
            if part.lower is None or part.upper is None or part.upper > shorter:
                continue
            args = {
                "name": part.name,
                "lower": part.lower,
                "upper": part.upper,
                "completed_before": completed_before,
                "failed_before": failed_before,
                "limit": params.move_limit + 1,
            }
            survivors = 0
            if part.upper > longer:
                survivors = int(self._raw_one("history_maintain.count_survivors", args)[0])
                if survivors > params.move_limit:
                    result.kept.append(part.name)
                    continue
            if params.dry_run:
                result.dropped.append(part.name)
                continue
            with self._atomic():
                self._execute("history_maintain.delete_logs", args)
            try:
                with self._unit(lock):
                    if survivors:
                        self._run_text("history_maintain.detach_sql", args)
                        self._run_text("history_maintain.move_survivors_sql", args)
                    self._run_text("history_maintain.drop_sql", args)
            except DjangoDatabaseError as exc:
                state = _sqlstate(exc)
                if state == LOCK_NOT_AVAILABLE:
                    result.deferred.append(part.name)
                    continue
                if state == UNDEFINED_TABLE:  # another leader dropped it
                    continue
                raise DatabaseError(f"history_maintain: dropping {part.name}: {exc}") from exc
            result.dropped.append(part.name)

    def _prune(
        self, now: dt.datetime, params: HistoryMaintainParams, result: HistoryMaintainResult
    ) -> None:
        """Delete rows past their own retention in bounded chunks, skipping deferred drops."""
        args: dict[str, Any] = {
            "completed_before": now - params.completed_retention,
            "failed_before": now - params.failed_retention,
            "skip": [*result.deferred, *(result.dropped if params.dry_run else ())],
            "limit": max(params.chunk_size, 1),
        }
        if params.dry_run:
            args["limit"] = max(params.chunk_size, 1) * max(params.max_chunks, 1)
            result.pruned = int(self._raw_one("history_maintain.count_expired", args)[0])
            return
        for _ in range(max(params.max_chunks, 1)):
            with self._atomic():
                deleted = self._execute("history_maintain.prune", args)
            result.pruned += deleted
            if deleted < args["limit"]:
                break

    def _prune_orphans(self, params: HistoryMaintainParams, result: HistoryMaintainResult) -> None:
        """Delete what gone jobs leave behind (batches, edges, step ledgers) in chunks.

        Nothing else ever deletes these rows, so without this a deployment
        would grow them for as long as it runs. Each chunk is its own
        statement (its own transaction outside one).
        """
        limit = max(params.chunk_size, 1)
        for name, field in (
            ("orphan_batches", "batches_deleted"),
            ("orphan_edges", "edges_deleted"),
            ("orphan_steps", "steps_deleted"),
        ):
            for _ in range(max(params.max_chunks, 1)):
                with self._atomic():
                    deleted = self._execute(f"history_maintain.{name}", {"limit": limit})
                setattr(result, field, getattr(result, field) + deleted)
                if deleted < limit:
                    break

    # -- indexes ------------------------------------------------------------

    def _history_index(self, params: HistoryIndexParams) -> HistoryIndexResult:
        """Build, concurrently, each parent index a partition lacks, and attach it;
        then repair the invalid indexes of hopper's tables.

        ``CREATE INDEX CONCURRENTLY`` cannot run in a transaction, so this
        runs in autocommit. An advisory lock keeps two leaders from building
        or repairing at once; the second finds it held and reports ``busy`` at
        once.
        """
        if self.connection.in_atomic_block:
            raise DatabaseError(
                "history_index builds indexes concurrently and must run outside a transaction"
            )
        result = HistoryIndexResult()
        strays = self._strays(params)
        missing = [row for row in self._fetchall("history_index", {}) if row[3] not in params.skip]
        broken = [
            (str(r[0]), str(r[1]), bool(r[2])) for r in self._fetchall("history_index.repair", {})
        ]
        skipped = [name for name, _, _ in broken if name in params.skip_repair]
        # A partition named in skip is left alone by the repair too, and a
        # stray copy is dropped, never rebuilt.
        left = {*params.skip_repair, *strays}
        repairs = [row for row in broken if row[0] not in left and row[1] not in params.skip]
        if missing or repairs or strays:
            if not self._raw_one("history_index.try_lock", {})[0]:
                result.busy = (
                    index_name(missing[0][3], missing[0][0])
                    if missing
                    else (repairs[0][0] if repairs else strays[0])
                )
                return result
            try:
                with self._index_settings(params):
                    # Listed again under the lock: a migration changes parents only under it.
                    for name in self._strays(params):
                        self._drop_stray(name, result)
                    for parent, tail, unique, partition in missing:
                        self._build_one(parent, tail, bool(unique), partition, result)
                    for name, table, transient in repairs:
                        self._repair_one(name, table, transient, result)
            finally:
                self._fetchone("history_index.unlock", {})
        # A parent index is reported invalid only once every partition has its
        # index: before that, it is a build still to do (skipped, deferred, timed out).
        unbuilt = {str(row[0]) for row in self._fetchall("history_index", {})}
        parents = [
            str(row[0])
            for row in self._fetchall("history_index.invalid", {})
            if str(row[0]) not in unbuilt
        ]
        result.invalid = sorted({*parents, *skipped, *result.repair_errors})
        return result

    @contextmanager
    def _index_settings(self, params: HistoryIndexParams) -> Iterator[None]:
        """Apply the pass's lock and statement timeouts to the session, then restore them."""
        old_lock, old_statement = self._raw_one("history_index.settings", {})
        self._fetchone(
            "history_index.set",
            {
                "lock_timeout": _ms(params.lock_timeout, DEFAULT_LOCK_TIMEOUT),
                "statement_timeout": (
                    _ms(params.statement_timeout, params.statement_timeout)
                    if params.statement_timeout > dt.timedelta(0)
                    else old_statement
                ),
            },
        )
        try:
            yield
        finally:
            self._fetchone(
                "history_index.set", {"lock_timeout": old_lock, "statement_timeout": old_statement}
            )

    def _repair_one(
        self, name: str, table: str, transient: bool, result: HistoryIndexResult
    ) -> None:
        """Repair one invalid index: rebuild it, or drop a rebuild's transient copy.

        ``REINDEX INDEX CONCURRENTLY`` keeps the index's name, definition and
        the constraint it may back, and takes the same lock as a build, so an
        index whose build is still under way defers its repair instead of
        disturbing it. A rebuild that fails leaves a ``*_ccnew`` copy, which is
        dropped at once.
        """
        args = {"name": name}
        try:
            self._run_text(
                "history_index.drop_sql" if transient else "history_index.reindex_sql", args
            )
        except DjangoDatabaseError as exc:
            state = _sqlstate(exc)
            if not transient:
                self._drop_rebuild_leftovers(table)
            if state == LOCK_NOT_AVAILABLE:
                result.deferred.append(name)
            elif state == QUERY_CANCELED:
                result.timed_out.append(table)
            elif state == UNDEFINED_OBJECT:  # dropped meanwhile (another session)
                pass
            else:
                result.repair_errors[name] = str(exc).strip().splitlines()[0]
            return
        (result.removed if transient else result.repaired).append(name)

    def _strays(self, params: HistoryIndexParams) -> list[str]:
        """Partitions' copies of parent indexes that are gone, valid or not.

        A pass names a partition's copy ``index_name(partition, parent)`` and
        attaches it once built; a copy attached to nothing whose name is no
        current parent's was left by a pass whose build or attach met the
        parent's drop, or by an interrupted build of a parent dropped since.
        Nothing would ever attach it: it is dropped, never rebuilt (a repair
        would make it valid and keep it, paying its writes on every history row).

        Only a copy of one of hopper's parents (named ``hopper_...``, as
        migrations name them) can be a stray: an index an operator made on one
        partition (``CREATE INDEX ON <partition> (subject)``, which PostgreSQL
        names ``<partition>_subject_idx``) is left alone.
        """
        parents = [str(row[0]) for row in self._fetchall("history_index.parents", {})]
        strays = []
        for name, partition in self._fetchall("history_index.unattached", {}):
            if partition in params.skip or not str(name).startswith(f"{partition}_hopper_"):
                continue  # not named as a pass names its copies of hopper's parents
            if name not in {index_name(partition, parent) for parent in parents}:
                strays.append(str(name))
        return strays

    def _drop_stray(self, name: str, result: HistoryIndexResult) -> None:
        """Drop one stray copy concurrently; a lock held off defers it to a later pass."""
        try:
            self._run_text("history_index.drop_sql", {"name": name})
        except DjangoDatabaseError as exc:
            if _sqlstate(exc) in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
                result.deferred.append(name)
                return
            raise DatabaseError(f"history_index: dropping {name}: {exc}") from exc
        result.removed.append(name)

    def _history_index_declare(self, params: HistoryIndexDeclareParams) -> None:
        """Under the builder's lock, in one transaction: the parent index, or its drop
        with every partition's copy a pass left unattached."""
        with transaction.atomic(using=self.alias), db_errors():
            self._raw_one("history_index.wait_lock", {})
            args = {"name": params.name, "tail": params.definition}
            if not params.drop:
                self._run_text("history_index.declare_sql", args)
                return
            copies = [index_name(p.name, params.name) for p in self._history_partitions()]
            self._run_text("history_index.undeclare_sql", args)
            for copy in copies:  # the attached ones went with the parent
                self._run_text("history_index.undeclare_sql", {"name": copy})

    def _drop_rebuild_leftovers(self, table: str) -> None:
        """Drop the transient copies a failed rebuild left on ``table``, if it can now."""
        for (leftover,) in self._fetchall("history_index.repair_leftovers", {"table": table}):
            self._drop_leftover({"name": leftover})

    def _build_one(
        self, parent: str, tail: str, unique: bool, partition: str, result: HistoryIndexResult
    ) -> None:
        """Build one partition's index (again, if an earlier build left it invalid), attach it."""
        name = index_name(partition, parent)
        args = {
            "name": name,
            "partition": partition,
            "parent": parent,
            "unique": unique,
            "tail": tail,
        }
        row = self._fetchone("history_index.existing", args)
        try:
            if row is not None and not row[0]:
                self._run_text("history_index.drop_sql", args)
            if row is None or not row[0]:
                self._run_text("history_index.build_sql", args)
        except DjangoDatabaseError as exc:
            state = _sqlstate(exc)
            self._drop_leftover(args)
            if state == QUERY_CANCELED:
                result.timed_out.append(partition)
                return
            if state == LOCK_NOT_AVAILABLE:
                result.deferred.append(name)
                return
            raise DatabaseError(f"history_index: building {name}: {exc}") from exc
        try:
            self._run_text("history_index.attach_sql", args)
        except DjangoDatabaseError as exc:
            if _sqlstate(exc) in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
                result.deferred.append(name)
                return
            if _sqlstate(exc) in (UNDEFINED_TABLE, UNDEFINED_OBJECT):  # the parent is gone
                self._drop_leftover(args)
                return
            raise DatabaseError(f"history_index: attaching {name}: {exc}") from exc
        result.built.append(f"{partition}.{parent}")

    def _drop_leftover(self, args: Mapping[str, Any]) -> None:
        """Remove the invalid index a failed concurrent build leaves, if it can now."""
        try:
            self._run_text("history_index.drop_sql", args)
        except DjangoDatabaseError:
            pass  # the next pass finds it invalid and drops it then

    # -- live-table upkeep --------------------------------------------------

    def _jobs_maintain(self, params: JobsMaintainParams | None = None) -> JobsMaintainResult:
        """Vacuum or analyze each hot table that needs it, skipping any that is locked.

        VACUUM cannot run inside a transaction: inside one, a table that needs
        it is reported as failed (ANALYZE still runs). Each table is kept
        whether or not another's maintenance fails.
        """
        params = params or JobsMaintainParams()
        result = JobsMaintainResult()
        stats = self._fetchall("jobs_maintain", {"tables": list(HOT_TABLES)})
        old = self._raw_one(
            "jobs_maintain.lock_timeout", {"value": _ms(dt.timedelta(0), DEFAULT_LOCK_TIMEOUT)}
        )[0]
        try:
            for table, dead, live, changed, estimate in stats:
                action = upkeep_action(int(dead), int(live), int(changed), int(estimate), params)
                if action is None:
                    continue
                if action == "vacuum" and self.connection.in_atomic_block:
                    result.tables[table] = "failed: VACUUM cannot run inside a transaction"
                    continue
                builder = (
                    "jobs_maintain.vacuum_sql"
                    if action == "vacuum"
                    else ("jobs_maintain.analyze_sql")
                )
                try:
                    if self.connection.in_atomic_block:
                        with transaction.atomic(using=self.alias):
                            self._run_text(builder, {"table": table})
                    else:
                        self._run_text(builder, {"table": table})
                except DjangoDatabaseError as exc:
                    result.tables[table] = f"failed: {exc}"
                    continue
                result.tables[table] = "vacuumed" if action == "vacuum" else "analyzed"
        finally:
            self._fetchone("jobs_maintain.restore", {"value": old})
        state = result.tables.get(HOT_TABLES[0], "")
        result.vacuumed = state == "vacuumed"
        result.analyzed = state in ("vacuumed", "analyzed")
        return result


class PostgresPeriodicHistoryMixin(PostgresPeriodicMixin, PostgresHistoryMixin):
    """History and live-table upkeep of the PostgreSQL engine, to list before its base class."""
