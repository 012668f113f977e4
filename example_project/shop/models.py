"""The example shop's data: orders, and a ledger the jobs write to."""

from django.db import models


class Order(models.Model):
    """An order; its confirmation job is enqueued in the transaction that creates it."""

    email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.email}"


class Charge(models.Model):
    """A payment-gateway call the charge job made; the first one per order fails."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="charges")
    attempt = models.PositiveIntegerField()
    succeeded = models.BooleanField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        outcome = "ok" if self.succeeded else "declined"
        return f"charge of order {self.order_id}, attempt {self.attempt}: {outcome}"
