"""A side table that test jobs write to, to prove exactly-once effects."""

from django.db import models


class Effect(models.Model):
    job_id = models.UUIDField()
    fence = models.BigIntegerField(default=0)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        app_label = "testapp"
