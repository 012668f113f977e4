"""History retention and upkeep on SQLite (``history_maintain``, ``history_index``,
``jobs_maintain``).

History is one table. Retention deletes the jobs past their own retention
(and their attempt logs) in chunks of ``chunk_size``, each chunk its own short
write transaction, so a pass never holds the single write lock for long and
finalizes slip in between. There are no partitions to create or drop and no
per-partition indexes to build.
"""

from __future__ import annotations

import json

from django_hopper.engine.params import (
    HistoryIndexDeclareParams,
    HistoryIndexParams,
    HistoryIndexResult,
    HistoryMaintainParams,
    HistoryMaintainResult,
    JobsMaintainParams,
    JobsMaintainResult,
)
from django_hopper.engine.rules import HOT_TABLES, stale_statistics
from django_hopper.engine.sqlite.convert import db_time
from django_hopper.engine.sqlite.periodic import SQLitePeriodicMixin
from django_hopper.engine.sqlite.support import Q, SQLiteSupport, is_locked, translate_errors
from django_hopper.types import HistoryPartitionRow


class SQLiteHistoryMixin(SQLiteSupport):
    """``history_*`` and ``jobs_maintain`` of the SQLite engine."""

    @translate_errors
    def _history_maintain(self, params: HistoryMaintainParams) -> HistoryMaintainResult:
        """Delete jobs past their own retention, with their logs, in bounded chunks."""
        now, _ = self._now(params.now)
        chunk = max(params.chunk_size, 1)
        args = {
            "completed_before": db_time(now - params.completed_retention),
            "failed_before": db_time(now - params.failed_retention),
            "limit": chunk,
        }
        result = HistoryMaintainResult()
        if not params.prune:
            return result
        if params.dry_run:
            with self._cursor() as cursor:
                cursor.execute(
                    Q["history_maintain.count_expired"],
                    {**args, "limit": chunk * max(params.max_chunks, 1)},
                )
                result.pruned = int(cursor.fetchone()[0])
            return result
        for _ in range(max(params.max_chunks, 1)):
            with self._atomic(), self._cursor() as cursor:
                cursor.execute(Q["history_maintain"], args)
                ids = json.dumps([row[0] for row in cursor.fetchall()])
                cursor.execute(Q["history_maintain.delete_logs"], {"ids": ids})
                cursor.execute(Q["history_maintain.delete"], {"ids": ids})
                deleted = int(cursor.rowcount)
            result.pruned += deleted
            if deleted < chunk:
                break
        self._prune_orphans(chunk, max(params.max_chunks, 1), result)
        return result

    def _prune_orphans(self, chunk: int, chunks: int, result: HistoryMaintainResult) -> None:
        """Delete what gone jobs leave behind (batches, edges, step ledgers) in chunks.

        Nothing else ever deletes these rows, so without this a deployment
        would grow them for as long as it runs. Each chunk is its own short
        write transaction, as the prune's are.
        """
        for _ in range(chunks):
            with self._atomic(), self._cursor() as cursor:
                cursor.execute(Q["history_maintain.orphan_batches"], {"limit": chunk})
                ids = json.dumps([row[0] for row in cursor.fetchall()])
                cursor.execute(Q["history_maintain.orphan_batches_progress"], {"ids": ids})
                cursor.execute(Q["history_maintain.orphan_batches_delete"], {"ids": ids})
                deleted = int(cursor.rowcount)
            result.batches_deleted += deleted
            if deleted < chunk:
                break
        for name, field in (("orphan_edges", "edges_deleted"), ("orphan_steps", "steps_deleted")):
            for _ in range(chunks):
                with self._atomic(), self._cursor() as cursor:
                    cursor.execute(Q[f"history_maintain.{name}"], {"limit": chunk})
                    deleted = int(cursor.rowcount)
                setattr(result, field, getattr(result, field) + deleted)
                if deleted < chunk:
                    break

    @translate_errors
    def _history_partitions(self) -> list[HistoryPartitionRow]:
        """Return the single history table as the one storage unit, with its row count."""
        with self._cursor() as cursor:
            cursor.execute(Q["history_partitions"], {})
            (count,) = cursor.fetchone()
        return [
            HistoryPartitionRow(
                name="hopper_job_history",
                lower=None,
                upper=None,
                rows_estimate=int(count),
                is_default=False,
            )
        ]

    def _history_index(self, params: HistoryIndexParams) -> HistoryIndexResult:
        """Return an empty result: migrations build the one history table's indexes."""
        return HistoryIndexResult()

    def _history_index_declare(self, params: HistoryIndexDeclareParams) -> None:
        """Do nothing: history is one table, whose indexes migrations build."""

    @translate_errors
    def _jobs_maintain(self, params: JobsMaintainParams | None = None) -> JobsMaintainResult:
        """Analyze each hot table whose statistics are stale, never waiting long.

        The rule is ``rules.stale_statistics``, the one PostgreSQL follows, fed
        what SQLite can tell cheaply: the rows a table held at its last
        ANALYZE (``sqlite_stat1``) and its rows now (a count: a read, so in
        WAL mode it never holds the write lock). SQLite keeps no count of the
        rows changed since then and reuses the pages of deleted rows (nothing
        to vacuum), so only the row estimate being off by ``analyze_ratio``
        (or never taken) asks for an ANALYZE. Its cost follows the table, so
        it is paid again only after the table grew or shrank by that factor:
        never on every pass. Each index the ANALYZE found empty gets the
        statistics row of an empty index, as newer SQLite writes itself, so
        the plans do not depend on the SQLite version. A writer holding the
        lock makes a table's ANALYZE fail at once ("failed: ..."), with
        nothing written; the next pass tries again.
        """
        params = params or JobsMaintainParams()
        result = JobsMaintainResult()
        with self._cursor() as cursor:
            cursor.execute(Q["jobs_maintain"])
            analyzed_ever = bool(cursor.fetchone()[0])
            for table in HOT_TABLES:
                estimate = -1
                if analyzed_ever:
                    cursor.execute(Q["jobs_maintain.estimate"], {"table": table})
                    estimate = int(cursor.fetchone()[0])
                cursor.execute(Q["jobs_maintain.count"].format(table=table))
                live = int(cursor.fetchone()[0])
                if not stale_statistics(live, 0, estimate, params):
                    continue
                try:
                    with (
                        self._short_lock_wait(cursor, "jobs_maintain"),
                        self._atomic(savepoint=True),
                    ):
                        cursor.execute(Q["jobs_maintain.analyze"].format(table=table))
                        cursor.execute(Q["jobs_maintain.empty_indexes"], {"table": table})
                        cursor.execute(Q["jobs_maintain.reload"])
                except Exception as exc:
                    if not is_locked(exc):
                        raise
                    result.tables[table] = f"failed: {exc}"
                    continue
                result.tables[table] = "analyzed"
        result.analyzed = result.tables.get(HOT_TABLES[0]) == "analyzed"
        return result


class SQLitePeriodicHistoryMixin(SQLitePeriodicMixin, SQLiteHistoryMixin):
    """History and live-table upkeep of the SQLite engine, to list before its base class."""
