"""Settings of the worker processes the Tasks backend tests start: the test settings plus TASKS.

The TASKS entries are the ones every test of this package runs under (the
tests set them with the ``settings`` fixture; a worker process reads them
here). The worker also imports :mod:`tests.tasks_backend.receivers`, whose
receivers use the ORM, and logs the Tasks API's logger to its output the way
``assertLogs`` formats it, so that tests can read both.
"""

from __future__ import annotations

from typing import Any

from tests.settings import *  # noqa: F403
from tests.settings import HOPPER, LOGGING

#: The TASKS setting of this package's tests (and of its worker processes).
TASKS: dict[str, Any] = {
    "default": {
        "BACKEND": "django_hopper.tasks.backend.HopperBackend",
        "QUEUES": ["default", "queue_1", "emails"],
    },
    "retrying": {
        "BACKEND": "django_hopper.tasks.backend.HopperBackend",
        "QUEUES": [],
        "OPTIONS": {"max_attempts": 3},
    },
}

HOPPER = {**HOPPER, "IMPORTS": [*HOPPER["IMPORTS"], "tests.tasks_backend.receivers"]}

LOGGING = {
    **LOGGING,
    "formatters": {"plain": {"format": "%(levelname)s:%(name)s:%(message)s"}},
    "handlers": {
        **LOGGING["handlers"],
        "tasks": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "loggers": {
        **LOGGING["loggers"],
        "django.tasks": {"handlers": ["tasks"], "level": "DEBUG"},
        "django_tasks": {"handlers": ["tasks"], "level": "DEBUG"},
    },
}
