"""What the engine's front makes of a vendor hook's outcome, written once.

A vendor hook runs its statements and reports what they did: the rows it
changed, the rows it left alone and why, or that a fenced write found the
claim gone. This module decides the rest for both engines: the outcome of
each job, the domain error a one-job method raises (type and words), and the
notifications that go out afterwards. ``tests/engine_conformance`` pins the
errors on both engines.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from django_hopper.exceptions import (
    HopperError,
    JobErased,
    JobFenced,
    JobLocked,
    JobNotClaimable,
    JobRunning,
    NotFound,
    UniqueConflict,
)
from django_hopper.types import (
    CHANNEL_CONTROL,
    CHANNEL_DONE,
    CHANNEL_INSERT,
    Channel,
    ControlMessage,
    JobID,
    JobManyResult,
    JobOutcome,
    JobRow,
    JobState,
)

_EARLIEST = dt.datetime.min.replace(tzinfo=dt.UTC)

#: Notifications to send: one channel, its payloads.
Notice = tuple[Channel, list[str]]


@dataclass(slots=True)
class OperatorRows:
    """What an operator hook (``_job_cancel_many`` ...) did to the IDs it was given.

    A found job is either changed (its row afterwards; a deleted one as it
    was) or left alone with the reason, a :class:`JobOutcome`: RUNNING,
    UNIQUE_CONFLICT or FINISHED. An ID in neither was not found.
    """

    changed: list[JobRow] = field(default_factory=list)
    left: dict[JobID, str] = field(default_factory=dict)


def unique_ids(ids: Sequence[JobID]) -> list[JobID]:
    """Return the IDs once each, in request order: a job is decided once per call."""
    return list(dict.fromkeys(ids))


def last_stored(rows: Sequence[JobRow]) -> dict[JobID, JobRow]:
    """Return each job as last stored: its live row, else its newest history row."""
    ordered = sorted(rows, key=lambda j: (j.finalized_at is None, j.finalized_at or _EARLIEST))
    return {job.id: job for job in ordered}


def ended_by_delete(deleted: Iterable[JobRow]) -> list[JobRow]:
    """Return the deleted jobs that were waiting, as their batches and workflows
    count them: canceled, as a cancel would have ended them."""
    return [dataclasses.replace(j, state=JobState.CANCELED) for j in deleted if j.is_live]


def many_result(
    ids: Sequence[JobID], rows: OperatorRows, changed: Callable[[JobRow], str]
) -> JobManyResult:
    """Give every requested ID its outcome: ``changed(row)`` for a changed job,
    the hook's reason for one it left alone, NOT_FOUND for the rest."""
    by_id = {job.id: job for job in rows.changed}
    outcomes = {
        i: changed(by_id[i]) if i in by_id else rows.left.get(i, JobOutcome.NOT_FOUND) for i in ids
    }
    return JobManyResult(outcomes=outcomes, jobs=[by_id[i] for i in ids if i in by_id])


def cancel_outcome(job: JobRow) -> str:
    """A running job was asked to stop; any other changed job was canceled."""
    return JobOutcome.CANCEL_REQUESTED if job.state == JobState.RUNNING else JobOutcome.CANCELED


def refusal(outcome: str, id: JobID) -> HopperError | None:
    """Return the error a one-job operator method raises for ``outcome``, or None."""
    if outcome == JobOutcome.NOT_FOUND:
        return NotFound(f"job {id} does not exist")
    if outcome == JobOutcome.RUNNING:
        return JobRunning(f"job {id} is running; cancel it first")
    if outcome == JobOutcome.UNIQUE_CONFLICT:
        return UniqueConflict(f"job {id} cannot be retried: a live job holds its unique key")
    if outcome == JobOutcome.ERASED:
        return JobErased(f"job {id} was erased: its arguments are gone, it cannot run")
    return None


def claim_by_id_refusal(status: str, id: JobID) -> HopperError:
    """Return the error a claim by ID refused with ``status`` raises (the engines'
    statements name the first rule that applies)."""
    if status == "not_found":
        return NotFound(f"job {id} does not exist")
    if status == "finished":
        return JobNotClaimable(f"job {id} has finished; retry it to run it again")
    if status == "fenced":
        return JobFenced(f"job {id} is at another fence: another claim took it")
    if status == "running":
        return JobRunning(f"job {id} is running")
    return JobNotClaimable(
        f"job {id} cannot be claimed now: pending, past its TTL, in a paused queue, "
        "or behind an older job of its ordering key"
    )


def not_owned(id: JobID) -> JobFenced:
    """The error of a step-ledger call whose claim no longer owns the job."""
    return JobFenced(f"job {id} is no longer owned by this claim")


def lease_lost(id: JobID) -> JobFenced:
    """The error of a lease renewal once the lease is no longer the job's."""
    return JobFenced(f"the lease of job {id} is no longer the job's")


def locked(id: JobID) -> JobLocked:
    """The error of a call told not to wait, when another transaction holds the job
    (on a single-writer engine: when another transaction writes)."""
    return JobLocked(f"job {id} is locked by another transaction")


def no_consumer(name: str) -> NotFound:
    """The error of a call naming a stream consumer that does not exist."""
    return NotFound(f"no stream consumer is named {name!r}")


def no_subscription(name: str) -> NotFound:
    """The error of a call naming a subscription that does not exist."""
    return NotFound(f"no subscription is named {name!r}")


def done(jobs: Sequence[JobRow]) -> list[Notice]:
    """Tell waiters (``JobHandle.wait``) that these awaited jobs ended."""
    awaited = [str(j.id) for j in jobs if j.awaited]
    return [(CHANNEL_DONE, awaited)] if awaited else []


def woken(jobs: Sequence[JobRow]) -> list[Notice]:
    """Wake the workers of each queue that has one of these jobs available now."""
    return woken_queues([j.queue for j in jobs if j.state == JobState.AVAILABLE])


def woken_queues(queues: Sequence[str]) -> list[Notice]:
    """Wake the workers of these queues, each once."""
    unique = sorted(set(queues))
    return [(CHANNEL_INSERT, unique)] if unique else []


def cancel_notices(jobs: Sequence[JobRow]) -> list[Notice]:
    """After a cancel: stop the running jobs' attempts, tell waiters of the canceled ones."""
    running = [j for j in jobs if j.state == JobState.RUNNING]
    stop = [ControlMessage.cancel(j.id).payload() for j in running]
    notices: list[Notice] = [(CHANNEL_CONTROL, stop)] if stop else []
    return notices + done([j for j in jobs if j.state != JobState.RUNNING])


def delete_notices(jobs: Sequence[JobRow]) -> list[Notice]:
    """After a delete: a waiting job deleted ends for its waiters; a finished one had ended."""
    return done([j for j in jobs if j.is_live])
