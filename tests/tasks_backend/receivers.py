"""Receivers of the Tasks API's signals that use the ORM, as a project's would.

Imported by the worker processes of the tests (``HOPPER["IMPORTS"]`` of
:mod:`tests.tasks_backend.settings`), never by the test process itself. Each
records the signal as an ``Effect`` row (``note``: ``started RUNNING``,
``finished FAILED`` ...), which the test reads back.
"""

from __future__ import annotations

import uuid
from typing import Any

from django_hopper.tasks_compat import task_finished, task_started
from tests.testapp.models import Effect


def _record(name: str) -> Any:
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        Effect.objects.create(job_id=uuid.UUID(task_result.id), note=f"{name} {task_result.status}")

    return receiver


task_started.connect(_record("started"), weak=False, dispatch_uid="tests.orm.started")
task_finished.connect(_record("finished"), weak=False, dispatch_uid="tests.orm.finished")
