"""``manage.py hopper_maintain``: run the leader's services without running jobs."""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_hopper.conf import hopper_settings
from django_hopper.engine import get_engine
from django_hopper.engine.params import ClientRegisterParams, ClientRenewParams
from django_hopper.maintenance import default_services
from django_hopper.maintenance.leader import Elector
from django_hopper.management.options import check_schema, database_alias
from django_hopper.runs import drive_due
from django_hopper.topology import maintenance_alias
from django_hopper.worker import Worker, WorkerConfig, import_job_modules
from django_hopper.worker.db import close_thread_connections, reset_connection

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine

logger = logging.getLogger("django_hopper.maintenance")

#: Exit status of ``--once`` when another client holds the leader lease.
LEADER_BUSY = 3


class Command(BaseCommand):
    help = (
        "Run hopper's maintenance (rescue, scheduling, TTL expiry, client pruning, periodic "
        "jobs, retention): once with --once, or in a loop as a client that elects itself leader."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once",
            action="store_true",
            help=(
                "Take the leader lease, run every service once (waiting for background "
                "index builds), resign and exit. Exits with status 3 if another client "
                "leads (it runs these services already)."
            ),
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=0.0,
            help="With --once: seconds to wait for the leader lease before giving up.",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help=(
                "With --once: run the services even if another client leads (for an "
                "operator: services such as queue aging may then act twice)."
            ),
        )
        parser.add_argument(
            "--database",
            help="Database alias to maintain (default HOPPER['DATABASE']).",
        )
        parser.add_argument(
            "--drive-runs",
            type=int,
            default=0,
            metavar="LIMIT",
            help=(
                "With --once: then drive up to LIMIT due resumable runs in this process "
                "(as hopper_drive does), for a deploy with no worker for their queues."
            ),
        )
        parser.add_argument(
            "--drive-deadline",
            type=float,
            default=None,
            metavar="SECONDS",
            help="With --drive-runs: start no pass after this many seconds.",
        )

    def handle(self, *args: Any, **options: Any) -> None:

        alias = database_alias(options)
        check_schema(alias, wait_for_database=True)
        engine = get_engine(alias)
        drive = int(options.get("drive_runs") or 0)
        if drive and not options["once"]:
            raise CommandError("--drive-runs only applies to --once")
        if options["once"]:
            # The job modules register resumable kinds, whose claims that never
            # began the rescue counts as admission misses rather than attempts.
            import_job_modules()
            # Through the direct connection behind a transaction pooler: the
            # passes take advisory locks and set session settings.
            self.once(
                get_engine(maintenance_alias(alias)),
                wait=float(options["wait"]),
                force=bool(options["force"]),
                verbose=int(options.get("verbosity", 1)) >= 1,
            )
            if drive:
                report = drive_due(limit=drive, deadline=options.get("drive_deadline"))
                self.stdout.write(f"drive_runs: {json.dumps(report.as_dict())}")
            return
        if options["force"] or options["wait"]:
            raise CommandError("--force and --wait only apply to --once")
        worker = Worker(WorkerConfig(queues={}, run_jobs=False, maintenance=True), engine)
        sys.exit(worker.run())

    def once(self, engine: BaseEngine, *, wait: float, force: bool, verbose: bool) -> None:
        """Run every service once as the leader, then resign.

        Running them beside a live leader would do its work twice (a second
        rescue pass is harmless, a second aging pass raises priorities
        again), so the pass takes the leader lease first, keeps it renewed
        while it runs, and refuses when another client holds it, unless
        ``force``. It waits for work the services start in the background
        (history index builds) before it resigns: the process exiting would
        kill them mid-build.
        """

        client_ttl = float(hopper_settings.CLIENT_TTL)
        leader_ttl = float(hopper_settings.LEADER_TTL)
        # Periodic jobs are registered and inserted under a client lease, and
        # the leader lease belongs to a client: the pass holds one while it runs.
        client_id = engine.client_register(
            ClientRegisterParams(
                hostname=socket.gethostname(),
                ttl=dt.timedelta(seconds=client_ttl),
                info={"command": "hopper_maintain --once"},
            )
        )
        elector = Elector(engine, lambda: client_id, leader_ttl)
        stop = threading.Event()
        lost = threading.Event()
        renewer: threading.Thread | None = None
        try:
            leads = elector.run_once()
            deadline = time.monotonic() + max(wait, 0.0)
            while not leads and time.monotonic() < deadline:
                time.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)))
                leads = elector.run_once()
            if not leads and not force:
                leader = engine.leader_get()
                raise CommandError(
                    f"client {leader} holds the leader lease and runs these services "
                    "already; nothing was done. Use --wait SECONDS to wait for the lease, "
                    "or --force to run anyway.",
                    returncode=LEADER_BUSY,
                )
            if not leads:
                self.stderr.write("another client leads: running the services anyway (--force).")

            def renew() -> None:
                # Keep both leases alive however long a service (an index build) takes.
                period = max(min(client_ttl, leader_ttl) / 3, 0.05)
                try:
                    while not stop.wait(period):
                        try:
                            engine.client_renew(
                                ClientRenewParams(
                                    client_id=client_id, ttl=dt.timedelta(seconds=client_ttl)
                                )
                            )
                            if leads and not elector.run_once():
                                lost.set()
                        except Exception:
                            # Retried next period on a fresh connection; a lapse
                            # shows up as ``lost``.
                            reset_connection(engine.alias)
                            logger.warning(
                                "renewing the maintenance pass's leases failed; retrying in %.2fs",
                                period,
                                exc_info=True,
                            )
                finally:
                    close_thread_connections()

            renewer = threading.Thread(target=renew, name="hopper-maintain-renew", daemon=True)
            renewer.start()
            services = default_services(engine, lambda: client_id)
            try:
                for service in services:
                    if lost.is_set():
                        raise CommandError(
                            "lost the leader lease while running; the remaining services "
                            "were left to the new leader."
                        )
                    changed = service.run_once()
                    if verbose:
                        self.stdout.write(f"{service.name}: {changed}")
            finally:
                for service in services:
                    service.close(timeout=None)
        finally:
            stop.set()
            if renewer is not None:
                renewer.join()
            try:
                elector.resign(client_id)
            finally:
                engine.client_delete(client_id)
