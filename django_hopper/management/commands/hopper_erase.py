"""``manage.py hopper_erase SUBJECT``: erase a data subject's data from hopper's tables."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_hopper.api import erase_subject
from django_hopper.exceptions import HopperError


class Command(BaseCommand):
    help = (
        "Remove a data subject's data from every job that carries it (live and history), "
        "in one transaction, and print the erasure record (docs/privacy.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("subject", help="the subject key the jobs were enqueued with")
        parser.add_argument("--json", action="store_true", help="print the record as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        """Erase, then print what the record holds: never the subject itself."""
        try:
            erasure = erase_subject(options["subject"])
        except HopperError as exc:
            raise CommandError(str(exc)) from exc
        record = {
            "erasure": erasure.id,
            "erased_at": erasure.erased_at.isoformat(),
            "subject_digest": erasure.subject_digest,
            "jobs": erasure.jobs,
            "running": erasure.running,
            "steps": erasure.steps,
            "logs": erasure.logs,
            "results": erasure.results,
        }
        if options["json"]:
            self.stdout.write(json.dumps(record, sort_keys=True))
            return
        self.stdout.write(
            f"erasure {erasure.id}: {erasure.jobs} job(s) erased ({erasure.running} running, "
            f"fenced), {erasure.steps} step(s), {erasure.logs} log(s), {erasure.results} "
            f"workflow output(s) removed"
        )
