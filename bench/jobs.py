"""The benchmark's jobs: a no-op, and one that reports when it started."""

from __future__ import annotations

import time

from django_hopper.jobs import job


@job(queue="bench")
def noop() -> None:
    """Do nothing, so that what is measured is hopper, not the job."""


@job(queue="bench")
def stamp() -> float:
    """Return the wall clock at the start of the attempt (stored as the job's output).

    The enqueuing process records its commit time with the same clock (same
    machine), so pickup latency is ``output - committed``: no database clock
    is involved.
    """
    return time.time()
