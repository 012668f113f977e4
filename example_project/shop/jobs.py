"""The shop's jobs. The worker imports this module (``HOPPER["IMPORTS"]``).

Each job is idempotent enough to be retried: it reads what it already did from
the database before doing it again.
"""

from typing import Any

from django.utils import timezone

from django_hopper import job
from shop.models import Charge, Order


class PaymentDeclined(Exception):
    """The (pretend) payment gateway declined; a retry may succeed."""


@job(queue="emails")
def send_confirmation(order_id: int) -> str:
    """Mark an order confirmed, as if the confirmation email went out."""
    order = Order.objects.get(pk=order_id)
    Order.objects.filter(pk=order_id, confirmed_at__isnull=True).update(confirmed_at=timezone.now())
    return f"confirmation sent to {order.email}"


@job(max_attempts=3)
def charge_order(order_id: int) -> dict[str, Any]:
    """Charge an order; the gateway declines the first try, so the job retries once.

    Each try is written to the Charge table outside any job transaction, so
    the second attempt sees that the first was declined.
    """
    order = Order.objects.get(pk=order_id)
    tries = order.charges.count()
    if tries == 0:
        Charge.objects.create(order=order, attempt=1, succeeded=False)
        raise PaymentDeclined(f"gateway declined order {order_id} (try again)")
    Charge.objects.create(order=order, attempt=tries + 1, succeeded=True)
    return {"order": order_id, "charged_cents": order.total_cents, "tries": tries + 1}


@job(takes_context=True)
def nightly_report(context: Any, day: str) -> dict[str, Any]:
    """Summarize the orders; log through the context, which stores lines with the attempt."""
    count = Order.objects.count()
    context.log(f"attempt {context.attempt} of job {context.job_id}: {count} order(s) on {day}")
    return {"day": day, "orders": count}


@job(priority=10)
def add(a: int, b: int) -> int:
    """Add two numbers: the smallest useful job."""
    return a + b
