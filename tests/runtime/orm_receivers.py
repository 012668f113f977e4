"""Receivers of hopper's ``job_started`` and ``job_finished`` that use the ORM, as a
project's would.

Imported by the worker processes of the tests that name it in
``HOPPER["IMPORTS"]``, never by the test process itself. Each records the
signal as an ``Effect`` row (``note``: ``started``, ``finished completed`` ...)
after a query, which the test reads back.
"""

from __future__ import annotations

from typing import Any

from django_hopper import signals
from tests.testapp.models import Effect


def on_started(sender: Any, job: Any, **kwargs: Any) -> None:
    Effect.objects.filter(job_id=job.id, note="started").exists()
    Effect.objects.create(job_id=job.id, fence=job.fence, note="started")


def on_finished(sender: Any, job: Any, state: str, **kwargs: Any) -> None:
    Effect.objects.filter(job_id=job.id, note="started").exists()
    Effect.objects.create(job_id=job.id, fence=job.fence, note=f"finished {state}")


signals.job_started.connect(on_started, weak=False, dispatch_uid="tests.runtime.orm.started")
signals.job_finished.connect(on_finished, weak=False, dispatch_uid="tests.runtime.orm.finished")
