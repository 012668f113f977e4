"""``manage.py hopper_indexes``: build missing history indexes and repair invalid ones now.

The leader's ``HistoryIndexer`` runs the same pass every ten minutes; this
runs it once, in the foreground, and reports every outcome, for an operator
after an interrupted deploy or from cron. It exits non-zero when a repair
failed, after reporting the rest.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_hopper.engine import get_engine
from django_hopper.engine.params import HistoryIndexParams, HistoryIndexResult
from django_hopper.exceptions import HistoryIndexRepairError
from django_hopper.management.options import check_schema, database_alias
from django_hopper.topology import maintenance_alias

#: The names REINDEX CONCURRENTLY gives the transient copies of an index.
_TRANSIENT = re.compile(r"_cc(new|old)[0-9]*$")


class Command(BaseCommand):
    help = (
        "Build the indexes history partitions lack and repair the invalid indexes that "
        "interrupted concurrent builds left on hopper's tables (PostgreSQL), and report."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", help="Database alias (default HOPPER['DATABASE']).")
        parser.add_argument(
            "--skip-repair",
            action="append",
            default=[],
            metavar="INDEX",
            help="An invalid index not to repair this time (repeatable).",
        )
        parser.add_argument(
            "--skip",
            action="append",
            default=[],
            metavar="PARTITION",
            help="A history partition not to build indexes on this time (repeatable).",
        )
        parser.add_argument(
            "--lock-timeout",
            type=float,
            default=0.0,
            help="Seconds a build's attach or a repair waits for its lock (default 0.1).",
        )
        parser.add_argument(
            "--statement-timeout",
            type=float,
            default=0.0,
            help="Seconds a build or a repair may run (default: the session's).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        for name in ("lock_timeout", "statement_timeout"):
            if options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must not be negative")
        check_schema(alias, wait_for_database=False)
        # Through the direct connection behind a transaction pooler: the pass
        # takes an advisory lock and sets session settings.
        engine = get_engine(maintenance_alias(alias))
        if not engine.features.supports_concurrent_index_builds:
            self.stdout.write(
                f"The {engine.vendor} engine builds indexes in one blocking step, which "
                "leaves no invalid index behind: nothing to build or repair."
            )
            return
        params = HistoryIndexParams(
            skip=tuple(options["skip"]),
            skip_repair=tuple(options["skip_repair"]),
            lock_timeout=dt.timedelta(seconds=options["lock_timeout"]),
            statement_timeout=dt.timedelta(seconds=options["statement_timeout"]),
        )
        try:
            result = engine.history_index(params)
        except HistoryIndexRepairError as exc:
            self.report(exc.result)  # type: ignore[arg-type]
            raise CommandError(str(exc)) from exc
        self.report(result)

    def report(self, result: HistoryIndexResult) -> None:
        """Write one line per outcome, or that there was nothing to do."""
        lines = [
            *(f"built     {name}" for name in result.built),
            *(f"repaired  {name}" for name in result.repaired),
            *(f"removed   {name} ({_removed_why(name)})" for name in result.removed),
            *(f"deferred  {name} (locked; the next pass retries)" for name in result.deferred),
            *(f"timed out {name} (what it left was removed)" for name in result.timed_out),
            *(f"failed    {name}: {error}" for name, error in sorted(result.repair_errors.items())),
            *(f"invalid   {name}" for name in result.invalid),
        ]
        if result.busy:
            lines.append(
                f"busy      another session holds the build lock (next: {result.busy}); "
                "nothing was waited for"
            )
        self.stdout.write("\n".join(lines) if lines else "Every index is built and valid.")


def _removed_why(name: str) -> str:
    """Say what a removed index was: a rebuild's transient copy, or a stray partition copy."""
    if _TRANSIENT.search(name):
        return "an interrupted rebuild's copy"
    return "a partition's copy of a dropped index"
