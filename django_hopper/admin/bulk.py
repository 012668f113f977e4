"""Bulk job actions that scale: set-based engine calls over the selection, chunk by chunk.

A selection (or "all matching the filter") is walked by ID in chunks; each
chunk is one call of ``api.cancel_jobs`` / ``retry_jobs`` / ``delete_jobs``
(one engine statement for the chunk) in its own transaction, so 20,000 jobs
cost 20 statements, not 20,000 calls, and a failure leaves the chunks before
it done. The outcome of every job is counted into one message.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from django_hopper.admin.common import Outcomes
from django_hopper.types import JobManyResult, JobOutcome

#: Jobs per engine call (and per transaction).
CHUNK = 1000

#: How each outcome reads in the summary; refusals (the job is unchanged) are kept apart.
DONE_TEXT = {
    JobOutcome.CANCELED: "canceled",
    JobOutcome.CANCEL_REQUESTED: "asked to stop (running)",
    JobOutcome.RETRIED: "retried",
    JobOutcome.DELETED: "deleted",
}
REFUSED_TEXT = {
    JobOutcome.FINISHED: "already finished",
    JobOutcome.RUNNING: "running: cancel it first",
    JobOutcome.UNIQUE_CONFLICT: "a live job holds its unique key",
    JobOutcome.NOT_FOUND: "no longer exists",
    JobOutcome.ERASED: "erased: its arguments are gone",
}


def id_chunks(queryset: QuerySet[Any], size: int = CHUNK) -> Iterator[list[uuid.UUID]]:
    """Yield the queryset's job IDs in ascending chunks, each read by keyset (``id >``).

    Jobs an earlier chunk moved out of the listed table (a cancel moves them
    to history) do not shift the walk, as an offset would.
    """
    ids = queryset.order_by("id").values_list("id", flat=True)
    last: uuid.UUID | None = None
    while True:
        chunk = list((ids if last is None else ids.filter(id__gt=last))[:size])
        if not chunk:
            return
        yield chunk
        last = chunk[-1]


def count_into(outcomes: Outcomes, result: JobManyResult) -> None:
    """Add one call's per-job outcomes to the action's summary."""
    for job_id, outcome in result.outcomes.items():
        if outcome in DONE_TEXT:
            outcomes.add(DONE_TEXT[outcome])
        else:
            reason = REFUSED_TEXT.get(outcome, outcome)
            outcomes.refuse(reason, f"job {job_id}: {reason}")


def apply_in_chunks(
    queryset: QuerySet[Any],
    call: Callable[[list[uuid.UUID]], JobManyResult],
    outcomes: Outcomes,
    size: int = CHUNK,
) -> list[uuid.UUID]:
    """Run ``call`` on each chunk of the selection in its own transaction; return the IDs seen."""
    seen: list[uuid.UUID] = []
    for chunk in id_chunks(queryset, size):
        with transaction.atomic(using=queryset.db):
            result = call(chunk)
        count_into(outcomes, result)
        if len(seen) < 2:
            seen.extend(chunk[: 2 - len(seen)])
    return seen
