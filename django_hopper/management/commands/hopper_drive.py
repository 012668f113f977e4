"""``manage.py hopper_drive``: drive due resumable runs, bounded, from cron."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_hopper.exceptions import InvalidJob
from django_hopper.runs import drive_due
from django_hopper.worker import import_job_modules

#: Exit status when at least one pass failed (the report says which).
PASSES_FAILED = 4


class Command(BaseCommand):
    help = (
        "Drive due resumable runs in this process: take expired pass leases over, then run "
        "one pass of up to --limit due runs, starting none after --deadline seconds, and "
        "print the report (driven, finished, missed, failed). For cron, without workers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--limit", type=int, default=100, help="Most passes to start (default 100)."
        )
        parser.add_argument(
            "--deadline",
            type=float,
            default=None,
            help=(
                "Seconds after which no pass starts (one that started runs to its end: "
                "leave a pass's length of slack before the next cron run)."
            ),
        )
        parser.add_argument(
            "--kind",
            action="append",
            dest="kinds",
            help="Only runs of this @resumable kind (repeatable; default every registered one).",
        )
        parser.add_argument("--queue", help="Only runs in this queue.")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
        parser.add_argument(
            "--fail-on-error",
            action="store_true",
            help=f"Exit with status {PASSES_FAILED} if a pass failed (for cron's mail).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        import_job_modules()
        kinds = tuple(options["kinds"]) if options["kinds"] else None
        try:
            report = drive_due(
                limit=options["limit"],
                deadline=options["deadline"],
                kinds=kinds,
                queue=options["queue"],
            )
        except InvalidJob as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
        else:
            self.stdout.write(
                f"driven {report.driven}, finished {report.finished}, missed {report.missed}, "
                f"failed {report.failed}, taken over {report.taken_over}, skipped "
                f"{report.skipped} (stopped: {report.stopped})"
            )
            for run_id, error in report.errors:
                self.stdout.write(f"  {run_id}: {error}")
        if options["fail_on_error"] and report.failed:
            raise CommandError(f"{report.failed} pass(es) failed", returncode=PASSES_FAILED)
