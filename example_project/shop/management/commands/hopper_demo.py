"""``manage.py hopper_demo``: show hopper's guarantees on a small, visible workload.

A command of the example project's ``shop`` app, not of the library: a
project that installs django_hopper gets no command that imports this app. It
migrates, enqueues a handful of jobs (one that fails once and then succeeds,
one inside a transaction that rolls back, one created with its order in one
transaction), runs a worker until they are done, and prints what happened.
``make demo`` runs it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from django_hopper import api
from django_hopper.exceptions import NotFound
from django_hopper.jobs import JobHandle
from shop import jobs as shop
from shop.models import Order

#: How long the demo waits for its jobs before giving up (seconds).
DEADLINE = 60.0


class RolledBack(Exception):
    """Raised on purpose to roll back the demo's aborted checkout."""


class Command(BaseCommand):
    help = (
        "Run hopper's demo in the example project: enqueue a few jobs (a retry, a "
        "rolled-back enqueue, an order with its job in one transaction), work them, "
        "and print what happened."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-migrate", action="store_true", help="Do not run migrate first.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["no_migrate"]:
            self.step("Migrating the database")
            call_command("migrate", verbosity=0, interactive=False)

        tracked: list[tuple[str, JobHandle]] = []

        self.step("Enqueueing jobs")
        tracked.append(("a plain job", shop.add.enqueue(2, 3)))
        tracked.append(
            ("a job that takes context", shop.nightly_report.enqueue(day=str(timezone.localdate())))
        )
        for i, handle in enumerate(shop.add.enqueue_many([{"a": i, "b": i} for i in range(3)])):
            tracked.append((f"batch item {i} (enqueue_many)", handle))

        with transaction.atomic():
            order = Order.objects.create(email="ada@example.com", total_cents=4200)
            confirm = shop.send_confirmation.enqueue(order_id=order.pk)
            charge = shop.charge_order.enqueue(order_id=order.pk)
        tracked.append((f"confirmation of order {order.pk} (same transaction)", confirm))
        tracked.append((f"charge of order {order.pk} (declined once, then retried)", charge))

        once = f"report-{uuid.uuid4().hex[:8]}"
        first = shop.nightly_report.using(unique_key=once).enqueue(day="unique")
        again = shop.nightly_report.using(unique_key=once).enqueue(day="unique")
        tracked.append(("a unique job", first))

        aborted: list[tuple[int, uuid.UUID]] = []  # (order, job) of the aborted checkout
        try:
            with transaction.atomic():
                lost = Order.objects.create(email="bob@example.com", total_cents=999)
                aborted.append((lost.pk, shop.send_confirmation.enqueue(order_id=lost.pk).id))
                raise RolledBack
        except RolledBack:
            pass
        rolled_back_order, rolled_back_job = aborted[0]
        for label, handle in tracked:
            self.stdout.write(f"  {handle.id}  {handle.kind}  <- {label}")
        self.stdout.write(
            f"  {again.id}  enqueued again with unique key {once!r}: "
            f"duplicate={again.duplicate}, same job: {again.id == first.id}"
        )
        self.stdout.write(f"  {rolled_back_job}  enqueued inside a transaction that rolled back")

        self.step("Running a worker until the jobs are done (hopper_worker --burst)")
        ids = [h.id for _, h in tracked]
        started = time.monotonic()
        self.work(ids)
        elapsed = time.monotonic() - started

        self.step(f"What happened ({elapsed:.1f}s of work)")
        ok = True
        for label, handle in tracked:
            row = api.get_job(handle.id)
            ok &= row.state == "completed"
            self.stdout.write(
                f"  {self.state(row.state)}  {row.kind.rsplit('.', 1)[-1]:<18} "
                f"attempts {row.attempt}/{row.max_attempts}  output={row.output!r}  ({label})"
            )
            for err in row.errors:
                self.stdout.write(f"      attempt {err.attempt} failed: {err.error}")
            for log in api.job_logs(row.id):
                for line in log.log.splitlines():
                    self.stdout.write(f"      log of attempt {log.attempt}: {line}")

        self.step("The rolled-back transaction")
        try:
            api.get_job(rolled_back_job)
        except NotFound:
            self.stdout.write(self.style.SUCCESS(f"  job {rolled_back_job} does not exist"))
        else:
            ok = False
            self.stdout.write(self.style.ERROR(f"  job {rolled_back_job} EXISTS"))
        if Order.objects.filter(pk=rolled_back_order).exists():
            ok = False
            self.stdout.write(self.style.ERROR(f"  order {rolled_back_order} EXISTS"))
        else:
            self.stdout.write(self.style.SUCCESS("  nor does its order: they rolled back together"))
        order.refresh_from_db()
        charges = ", ".join(
            f"try {c.attempt} {'ok' if c.succeeded else 'declined'}"
            for c in order.charges.order_by("id")
        )
        self.stdout.write(f"  order {order.pk}: confirmed at {order.confirmed_at}; {charges}")
        if not ok:
            raise CommandError("the demo did not end as expected (see above)")
        self.stdout.write(self.style.SUCCESS("\nAll demo jobs completed."))

    def work(self, ids: list[uuid.UUID]) -> None:
        """Run burst workers until every tracked job is finished or the deadline passes.

        A burst worker exits once nothing is due; a retry scheduled a moment
        later is then worked by the next round.
        """
        deadline = time.monotonic() + DEADLINE
        while True:
            # A failing worker raises CommandError, which ends the demo with its message.
            call_command("hopper_worker", "--burst", verbosity=0)
            live = [row for row in (api.get_job(i) for i in ids) if row.is_live]
            if not live:
                return
            if time.monotonic() > deadline:
                raise CommandError(f"{len(live)} job(s) still not finished after {DEADLINE:.0f}s")
            now = timezone.now()
            due = min(row.scheduled_at for row in live)
            time.sleep(min(max((due - now).total_seconds(), 0.05), 1.0))

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"\n{text}"))

    def state(self, state: str) -> str:
        style = self.style.SUCCESS if state == "completed" else self.style.ERROR
        return style(f"{state:<10}")
