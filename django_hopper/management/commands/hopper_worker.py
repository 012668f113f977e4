"""``manage.py hopper_worker``: run jobs (one process = one client)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_hopper.validation import QUEUE_RE


def parse_queues(value: str, default_concurrency: int | None = None) -> dict[str, int]:
    """Parse ``name:conc,name2:conc``; a bare name takes ``default_concurrency`` or 10.

    Queue names may contain ``:``, so only a numeric last segment is a concurrency.
    """
    queues: dict[str, int] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        name, sep, conc = part.rpartition(":")
        if not sep or not conc.lstrip("-").isdigit():
            name, conc = part, ""
        if not QUEUE_RE.match(name):
            raise CommandError(f"--queues: malformed queue name {name!r}")
        n = int(conc) if conc else (default_concurrency or 10)
        if n < 1:
            raise CommandError(f"--queues: concurrency of {name!r} must be at least 1")
        queues[name] = n
    if not queues:
        raise CommandError("--queues names no queue")
    return queues


class Command(BaseCommand):
    help = "Run hopper jobs from the given queues until stopped (SIGTERM/SIGINT)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            help="Queues and concurrency, e.g. default:10,emails:4 (default: HOPPER['QUEUES']).",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            help="Concurrency of every queue (overrides the per-queue numbers).",
        )
        parser.add_argument(
            "--processes", type=int, default=1, help="Run N worker processes under a supervisor."
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Run every due job, then exit once nothing is claimable and nothing runs.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            help="Seconds to wait for running jobs when stopping (HOPPER['SHUTDOWN_TIMEOUT']).",
        )
        parser.add_argument(
            "--no-maintenance",
            action="store_true",
            help="Do not take part in leader election (run hopper_maintain elsewhere).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django_hopper.conf import hopper_settings
        from django_hopper.worker import Worker, WorkerConfig
        from django_hopper.worker.supervisor import Supervisor

        _configure_logging(int(options.get("verbosity", 1)))
        if options["queues"]:
            queues = parse_queues(options["queues"], options["concurrency"])
        else:
            queues = {str(k): int(v) for k, v in dict(hopper_settings.QUEUES).items()}
        if options["concurrency"] is not None:
            if options["concurrency"] < 1:
                raise CommandError("--concurrency must be at least 1")
            queues = {q: options["concurrency"] for q in queues}
        processes = options["processes"]
        if processes < 1:
            raise CommandError("--processes must be at least 1")
        if processes > 1:
            argv = ["--queues", ",".join(f"{q}:{c}" for q, c in queues.items())]
            if options["burst"]:
                argv.append("--burst")
            if options["shutdown_timeout"] is not None:
                argv += ["--shutdown-timeout", str(options["shutdown_timeout"])]
            if options["no_maintenance"]:
                argv.append("--no-maintenance")
            if options.get("settings"):
                argv += ["--settings", options["settings"]]
            argv += ["--verbosity", str(options.get("verbosity", 1))]
            code = Supervisor(processes, argv, burst=options["burst"]).run()
            if code:
                raise CommandError(f"worker processes exited with status {code}", returncode=code)
            return
        config = WorkerConfig(
            queues=queues,
            burst=options["burst"],
            shutdown_timeout=options["shutdown_timeout"],
            maintenance=not options["no_maintenance"],
        )
        worker = Worker(config)
        code = worker.run()
        if worker.stranded:
            # Threads of jobs that outlived the shutdown timeout cannot be joined;
            # leave without waiting for them (the rescue recovers their jobs).
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            raise CommandError(f"worker exited with status {code}", returncode=code)


def _configure_logging(verbosity: int) -> None:
    """Show the runtime's INFO lines at verbosity >= 2 (WARNING otherwise), unless configured."""
    log = logging.getLogger("django_hopper")
    if verbosity >= 2 and log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO if verbosity == 2 else logging.DEBUG)
