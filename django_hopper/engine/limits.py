"""The limited claim's arithmetic, written once for every engine.

An engine's limited claim locks the queue row, reads it (:class:`QueueState`),
asks :func:`plan_claim` how many jobs it may claim, claims at most that many
(its SQL applies the partition limit, which depends on the candidate rows),
and stores :func:`spend`'s token count back in the row, all in one
transaction. So the two engines cannot disagree about the global limit, the
token bucket or how long to wait.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from django_hopper.engine.params import QueueState
from django_hopper.exceptions import InvalidJob
from django_hopper.types import QueueLimits
from django_hopper.validation import queue_name

#: Tokens are floats; this absorbs their rounding so that 1.9999999 allows one claim.
_EPSILON = 1e-9


@dataclass(slots=True, frozen=True)
class ClaimPlan:
    """What a limited claim may do now."""

    #: How many jobs it may claim (0 when paused or a limit allows nothing).
    limit: int
    #: Tokens in the bucket after refilling to now; None without a rate limit.
    tokens: float | None
    #: When positive, how long the rate limit allows nothing.
    wait: dt.timedelta = dt.timedelta(0)


def burst(limits: QueueLimits) -> int:
    """Return the bucket's size: the configured burst, or one second's worth."""
    if limits.rate_burst > 0:
        return limits.rate_burst
    return max(1, math.ceil(limits.rate_per_sec))


def refill(state: QueueState) -> float | None:
    """Return the bucket's tokens at ``state.now``: what was left plus what the rate
    added since, capped at the burst; a bucket never used is full."""
    limits = state.limits
    if limits.rate_per_sec <= 0:
        return None
    size = float(burst(limits))
    if state.rate_tokens is None or state.rate_refilled_at is None:
        return size
    elapsed = max(0.0, (state.now - state.rate_refilled_at).total_seconds())
    return min(size, max(0.0, state.rate_tokens) + elapsed * limits.rate_per_sec)


def plan_claim(state: QueueState, want: int) -> ClaimPlan:
    """Return how many of ``want`` jobs a limited claim may take now.

    The global limit leaves ``global_limit - running`` slots across every
    client; the rate limit allows one claim per whole token. When the rate
    allows nothing the plan says how long until the next token, so the
    producer sleeps instead of spinning. A full global limit has no wait: a
    slot frees when a job ends, which nobody can predict.
    """
    if state.paused or want <= 0:
        return ClaimPlan(limit=0, tokens=None)
    limits = state.limits
    allowed = want
    if limits.global_limit > 0:
        allowed = min(allowed, max(0, limits.global_limit - state.running))
    tokens = refill(state)
    if tokens is not None:
        whole = math.floor(tokens + _EPSILON)
        if whole <= 0:
            wait = dt.timedelta(seconds=(1.0 - tokens) / limits.rate_per_sec)
            return ClaimPlan(limit=0, tokens=tokens, wait=max(wait, dt.timedelta(milliseconds=1)))
        allowed = min(allowed, whole)
    return ClaimPlan(limit=allowed, tokens=tokens)


def spend(plan: ClaimPlan, claimed: int) -> float | None:
    """Return the tokens left after ``claimed`` claims (None without a rate limit)."""
    if plan.tokens is None:
        return None
    return max(0.0, plan.tokens - claimed)


def partition_scan(limit: int, partition_limit: int) -> int:
    """Return how many candidates a claim reads to fill ``limit`` slots.

    With a partition limit, the best candidates may all belong to full
    partitions; reading a window past them finds others without walking
    the whole queue.
    """
    if partition_limit <= 0:
        return limit
    return limit * 10 + 100


def _count(value: Any, field: str) -> int:
    """Return a non-negative whole number or raise InvalidJob naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidJob(f"{field} must be a non-negative integer, not {value!r}", field=field)
    if value < 0 or value != int(value):
        raise InvalidJob(f"{field} must be a non-negative integer, not {value!r}", field=field)
    return int(value)


def validate_limits(limits: QueueLimits) -> QueueLimits:
    """Return the limits checked and normalized, or raise naming the bad field.

    Zero removes a limit. A burst needs a rate (alone it limits nothing, and
    saving it silently would suggest it did). A rate needs a bucket of at least one token, so an
    explicit burst of zero is refused only when it cannot be the default:
    ``rate_burst=0`` means "one second's worth" (see :func:`burst`).
    """
    name = queue_name(limits.name, "name")
    rate = limits.rate_per_sec
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not math.isfinite(rate)
        or rate < 0
    ):
        raise InvalidJob(
            f"rate_per_sec must be a non-negative number, not {rate!r}", field="rate_per_sec"
        )
    burst = _count(limits.rate_burst, "rate_burst")
    if burst and not rate:
        raise InvalidJob(
            f"rate_burst {burst} needs a rate: set rate_per_sec, or leave the burst out",
            field="rate_burst",
        )
    aging = limits.aging
    if not isinstance(aging, dt.timedelta) or aging < dt.timedelta(0):
        raise InvalidJob(f"aging must be a non-negative timedelta, not {aging!r}", field="aging")
    return QueueLimits(
        name=name,
        global_limit=_count(limits.global_limit, "global_limit"),
        rate_per_sec=float(rate),
        rate_burst=burst,
        partition_limit=_count(limits.partition_limit, "partition_limit"),
        aging=aging,
    )
