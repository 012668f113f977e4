"""``manage.py hopper_maintain``: run the leader's services without running jobs."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Run hopper's maintenance (rescue, scheduling, TTL expiry, client pruning): "
        "once with --once, or in a loop as a client that elects itself leader."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="Run every service once and exit.")

    def handle(self, *args: Any, **options: Any) -> None:
        from django_hopper.engine import get_engine
        from django_hopper.maintenance import default_services
        from django_hopper.worker import Worker, WorkerConfig

        if options["once"]:
            import datetime as dt
            import socket

            from django_hopper.engine.base import ClientRegisterParams

            engine = get_engine()
            # Periodic jobs are registered and inserted under a client lease,
            # so a one-off pass holds one for its duration.
            client_id = engine.client_register(
                ClientRegisterParams(
                    hostname=socket.gethostname(),
                    ttl=dt.timedelta(minutes=5),
                    info={"command": "hopper_maintain --once"},
                )
            )
            try:
                for service in default_services(engine, lambda: client_id):
                    changed = service.run_once()
                    if options.get("verbosity", 1) >= 1:
                        self.stdout.write(f"{service.name}: {changed}")
            finally:
                engine.client_delete(client_id)
            return
        worker = Worker(WorkerConfig(queues={}, run_jobs=False, maintenance=True))
        sys.exit(worker.run())
