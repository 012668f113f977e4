"""Structured logging for the runtime: every job line names the job."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_hopper.types import JobRow

logger = logging.getLogger("django_hopper.worker")


class JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Add ``job_id``, ``kind``, ``queue`` and ``attempt`` to every record of a job.

    The fields go into ``extra`` (for structured handlers) and into the message
    prefix (for plain formatters), so no job line is anonymous.
    """

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        """Merge the job fields into ``extra`` and prefix the message with them."""
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        prefix = (
            f"[job={extra.get('job_id')} kind={extra.get('kind')} "
            f"queue={extra.get('queue')} attempt={extra.get('attempt')}]"
        )
        return f"{prefix} {msg}", kwargs


def job_logger(job: JobRow, base: logging.Logger | None = None) -> JobLogger:
    """Return a logger whose records carry the job's identity."""
    return JobLogger(
        base or logger,
        {"job_id": str(job.id), "kind": job.kind, "queue": job.queue, "attempt": job.attempt},
    )
