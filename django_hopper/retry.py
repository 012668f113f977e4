"""The retry rule: how long a failed attempt waits before the next one.

This is the only place the rule lives; the worker and the rescuer both call
:func:`backoff`, so a retried job waits the same whoever ended its attempt.
"""

from __future__ import annotations

import datetime as dt
import random

from django_hopper.conf import hopper_settings


def backoff(attempt: int, *, rng: random.Random | None = None) -> dt.timedelta:
    """Return the delay before the attempt after ``attempt`` (1-based) fails.

    ``BACKOFF_BASE * attempt ** BACKOFF_EXPONENT`` seconds, capped at
    ``BACKOFF_MAX``, then spread by ``±BACKOFF_JITTER`` (a fraction) so that jobs
    that failed together do not retry together. Jitter never pushes the delay
    past the cap or below zero.
    """
    base = float(hopper_settings.BACKOFF_BASE)
    exponent = float(hopper_settings.BACKOFF_EXPONENT)
    cap = float(hopper_settings.BACKOFF_MAX)
    jitter = float(hopper_settings.BACKOFF_JITTER)
    n = max(int(attempt), 1)
    try:
        seconds = base * float(n) ** exponent
    except OverflowError:
        seconds = cap
    seconds = min(seconds, cap)
    if jitter > 0 and seconds > 0:
        spread = (rng or random).uniform(-jitter, jitter)
        seconds = min(seconds * (1.0 + spread), cap)
    return dt.timedelta(seconds=max(seconds, 0.0))
