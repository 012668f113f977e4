"""``manage.py hopper_partitions``: show, create and drop history partitions by hand.

Without options it lists the partitions of history (name, day range, row
estimate). ``--create-ahead N`` creates the days from today to N days ahead,
``--drop-expired`` drops (or prunes) what is past retention, and ``--dry-run``
prints what either would change and changes nothing. The leader does the same
on its own (``maintenance.HistoryPruner``); this command is for operators.

On engines that keep history in one table (SQLite) there is nothing to
partition: the command says so and shows the history row count.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_hopper.engine import get_engine
from django_hopper.engine.params import HistoryMaintainResult
from django_hopper.exceptions import HopperError
from django_hopper.maintenance import HistoryPruner


class Command(BaseCommand):
    help = "List, create and drop the time partitions of hopper's job history."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=None, help="Database alias (HOPPER['DATABASE']).")
        parser.add_argument(
            "--create-ahead",
            type=int,
            default=None,
            metavar="N",
            help="Create the day partitions from today to N days ahead.",
        )
        parser.add_argument(
            "--drop-expired",
            action="store_true",
            help="Drop partitions past retention (and prune expired rows).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would change; change nothing."
        )
        parser.add_argument(
            "--lock-timeout",
            type=float,
            default=0.1,
            help="Seconds a creation or drop waits for its lock before it is deferred.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        engine = get_engine(options["database"])
        contract: Any = engine
        if not engine.features.supports_history_partitions:
            (table,) = contract.history_partitions()
            self.stdout.write(
                "History partitions are a PostgreSQL feature; this database keeps history "
                f"in one table, {table.name}, with {table.rows_estimate} rows. Retention "
                "deletes expired rows in chunks (hopper_maintain)."
            )
            return
        create_ahead = options["create_ahead"]
        drop = options["drop_expired"]
        if create_ahead is not None and create_ahead < 0:
            raise CommandError("--create-ahead must be 0 or more")
        if create_ahead is None and not drop:
            self._list(contract)
            return
        retention = HistoryPruner(
            engine, lock_timeout=dt.timedelta(seconds=options["lock_timeout"])
        )
        params = retention.params(
            create=create_ahead is not None,
            drop=drop,
            prune=drop,
            create_ahead=create_ahead or 0,
            dry_run=options["dry_run"],
        )
        try:
            result = contract.history_maintain(params)
        except HopperError as exc:
            raise CommandError(str(exc)) from exc
        self._report(result, options["dry_run"], pruning=drop)

    def _list(self, contract: Any) -> None:
        """Print one line per partition: name, range, rows estimate."""
        rows = contract.history_partitions()
        self.stdout.write(f"{'partition':<34} {'from':<12} {'to':<12} {'rows (est.)':>12}")
        for p in rows:
            lower = f"{p.lower:%Y-%m-%d}" if p.lower else ("DEFAULT" if p.is_default else "?")
            upper = f"{p.upper:%Y-%m-%d}" if p.upper else ""
            estimate = "unknown" if p.rows_estimate < 0 else str(p.rows_estimate)
            self.stdout.write(f"{p.name:<34} {lower:<12} {upper:<12} {estimate:>12}")

    def _report(self, result: HistoryMaintainResult, dry_run: bool, *, pruning: bool) -> None:
        """Print what changed (or would change, with --dry-run)."""
        would = "would " if dry_run else ""
        for name in result.created:
            self.stdout.write(f"{would}create {name}")
        for name in result.dropped:
            self.stdout.write(f"{would}drop {name}")
        for name in result.kept:
            self.stdout.write(f"keep {name} (too many jobs still within retention)")
        for name in result.deferred:
            self.stdout.write(f"deferred {name} (locked by another transaction; retry later)")
        if pruning:
            self.stdout.write(f"{would}delete {result.pruned} expired jobs individually")
        if not (result.created or result.dropped or result.deferred or result.pruned):
            self.stdout.write("nothing to do")
