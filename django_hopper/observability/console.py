"""The worker's console: a start line, job lines, a stop line; text or JSON.

Lines go through the standard :mod:`logging` loggers (``django_hopper.worker``
for the worker's own lines, ``django_hopper.job`` for job lines), so a project
that configures ``django_hopper`` in ``LOGGING`` gets them wherever it sends
logs. When it does not, ``hopper_worker`` installs one stderr handler itself
(:func:`install_handler`); a project's own configuration is never overridden.

Verbosity follows Django's ``-v``: 0 errors only; 1 (default) the start and
stop lines, failed, retried, discarded, rescued, timed-out and canceled jobs,
leader changes, queue pause/resume/limits changes and lost and regained
database connections; 2 adds a line per
started and finished job with its duration, and tracebacks; 3 everything the
library logs at DEBUG.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings

from django_hopper import __version__
from django_hopper.observability import Sink, add_sink, remove_sink

if TYPE_CHECKING:
    from django_hopper.types import JobRow
    from django_hopper.worker import Worker

job_logger = logging.getLogger("django_hopper.job")
worker_logger = logging.getLogger("django_hopper.worker")

#: Log formats ``--log-format`` and ``HOPPER["LOG_FORMAT"]`` accept.
FORMATS = ("text", "json")

#: The attributes every LogRecord has; anything else came through ``extra``.
_RECORD_FIELDS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class TextFormatter(logging.Formatter):
    """``[2026-12-01 10:40:41] WARNING message``: one line per record, as Django's console."""

    def __init__(self) -> None:
        super().__init__("[%(asctime)s] %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the ``extra`` fields, traceback.

    For log pipelines (Loki, Elasticsearch, CloudWatch): each job line carries
    ``job_id``, ``kind``, ``queue``, ``attempt`` and ``state`` as fields.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one JSON line."""
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["traceback"] = record.exc_text
        return json.dumps(out, default=str)


def formatter(fmt: str) -> logging.Formatter:
    """Return the formatter of a log format name (``text`` or ``json``)."""
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {fmt!r}; use one of {', '.join(FORMATS)}")


def logging_configures_hopper() -> bool:
    """Return whether the project configures the ``django_hopper`` loggers itself.

    True when ``LOGGING["loggers"]`` names ``django_hopper`` (or one of its
    children), or when the logger already has handlers (logging set up by
    hand, e.g. with ``LOGGING_CONFIG = None``).
    """

    config = getattr(settings, "LOGGING", None) or {}
    loggers = config.get("loggers", {}) if isinstance(config, dict) else {}
    if any(name == "django_hopper" or str(name).startswith("django_hopper.") for name in loggers):
        return True
    return bool(logging.getLogger("django_hopper").handlers)


#: Loggers the console handler is put on (Django's Tasks framework logs its
#: task lines on ``django.tasks``, the backport on ``django_tasks``).
_TASK_LOGGERS = ("django.tasks", "django_tasks")


def install_handler(
    verbosity: int, fmt: str = "text", stream: Any = None
) -> logging.Handler | None:
    """Install the worker's console handler unless ``LOGGING`` configures hopper.

    Returns the handler, or None when the project's configuration is kept.
    Installing again (a second ``call_command``) replaces the earlier handler.
    """
    if _installed is not None:
        _uninstall()
    if logging_configures_hopper():
        return None
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger("django_hopper")
    root.addHandler(handler)
    root.propagate = False
    level = {0: logging.ERROR, 1: logging.INFO, 2: logging.INFO}.get(verbosity, logging.DEBUG)
    root.setLevel(level)
    job_logger.setLevel(logging.DEBUG if verbosity >= 2 else logging.NOTSET)

    configured = (getattr(settings, "LOGGING", None) or {}).get("loggers", {})
    tasks = [name for name in _TASK_LOGGERS if name not in configured] if verbosity >= 2 else []
    for name in tasks:
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if verbosity >= 3 else logging.INFO)
        log.propagate = False
    _remember(handler, tasks)
    return handler


_installed: tuple[logging.Handler, list[str]] | None = None


def _remember(handler: logging.Handler, tasks: list[str]) -> None:
    global _installed
    _installed = (handler, tasks)


def _uninstall() -> None:
    global _installed
    if _installed is None:
        return
    handler, tasks = _installed
    for name in ["django_hopper", *tasks]:
        logging.getLogger(name).removeHandler(handler)
    logging.getLogger("django_hopper").propagate = True
    _installed = None


def _job_fields(job: JobRow, **more: Any) -> dict[str, Any]:
    fields = {
        "job_id": str(job.id),
        "kind": job.kind,
        "queue": job.queue,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
    }
    fields.update(more)
    return fields


def _error_text(error: BaseException | str | None) -> str:
    if error is None:
        return "unknown error"
    if isinstance(error, BaseException):
        text = str(error)
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    return str(error)


class ConsoleSink(Sink):
    """Log the worker's start and stop lines and its job lines.

    Counts each worker's results (by client ID) for the stop line.
    """

    def __init__(self, verbosity: int = 1, processes: int = 1) -> None:
        self.verbosity = verbosity
        self.processes = processes
        wants = {"finished", "worker_started", "worker_stopped"}
        if verbosity >= 2:
            wants.add("started")
        self.wants = frozenset(wants)
        self._lock = threading.Lock()
        self._counts: dict[int | None, Counter[str]] = {}
        self._since: dict[int | None, float] = {}

    # -- jobs ----------------------------------------------------------------

    def started(self, job: JobRow) -> None:
        """Log ``job ... started`` at DEBUG (shown at -v 2)."""
        if job_logger.isEnabledFor(logging.DEBUG):
            job_logger.debug(
                "job %s %s started (attempt %d of %d, queue %s)",
                job.kind,
                job.id,
                job.attempt,
                job.max_attempts,
                job.queue,
                extra=_job_fields(job, event="started"),
            )

    def finished(
        self, job: JobRow, state: str, error: BaseException | str | None, duration: float | None
    ) -> None:
        """Count the result; log a failure always and a success at -v 2."""
        with self._lock:
            counts = self._counts.get(job.attempted_by)
            if counts is None:
                counts = self._counts[job.attempted_by] = Counter()
            counts[state] += 1
            if error is not None and state != "canceled":
                counts["failed"] += 1
        success = state == "completed" or (state == "scheduled" and error is None)
        if success and not job_logger.isEnabledFor(logging.DEBUG):
            return  # the common case at -v 1: nothing to write
        took = f" in {duration:.3f}s" if duration is not None else ""
        fields = _job_fields(job, state=state, event="finished")
        if duration is not None:
            fields["duration"] = round(duration, 6)
        if success:
            word = "completed" if state == "completed" else "snoozed"
            job_logger.debug("job %s %s %s%s", job.kind, job.id, word, took, extra=fields)
            return
        exc_info = None
        if self.verbosity >= 2 and isinstance(error, BaseException):
            exc_info = (type(error), error, error.__traceback__)
        what = (
            f"timed out ({_error_text(error)})"
            if isinstance(error, TimeoutError)
            else f"failed: {_error_text(error)}"
        )
        fields["error"] = _error_text(error)
        if state in ("retryable", "discarded"):
            level, ending = (
                (logging.WARNING, "will retry")
                if state == "retryable"
                else (logging.ERROR, "discarded")
            )
            job_logger.log(
                level,
                "job %s %s %s (attempt %d of %d%s); " + ending,
                job.kind,
                job.id,
                what,
                job.attempt,
                job.max_attempts,
                took and "," + took,
                extra=fields,
                exc_info=exc_info,
            )
        elif state == "scheduled":  # snoozed by the worker (an unknown kind), not the job
            job_logger.info(
                "job %s %s not run: %s; snoozed (attempt %d of %d kept)",
                job.kind,
                job.id,
                _error_text(error),
                job.attempt,
                job.max_attempts,
                extra=fields,
            )
        elif state == "canceled":
            job_logger.warning(
                "job %s %s canceled (attempt %d of %d%s)",
                job.kind,
                job.id,
                job.attempt,
                job.max_attempts,
                took and "," + took,
                extra=fields,
            )

    # -- the worker ----------------------------------------------------------

    def worker_started(self, worker: Worker) -> None:
        """Log the start line: version, database, queues, processes, client, leader election."""

        cid = worker.client_id
        with self._lock:
            self._counts[cid] = Counter()
            self._since[cid] = time.monotonic()
        queues = worker.config.queues
        alias = worker.engine.alias
        vendor = worker.engine.vendor
        election = "takes part in leader election" if worker.config.maintenance else "no leader"
        worker_logger.info(
            "hopper %s worker started: client %s, database %r (%s), queues %s "
            "(%d slots), %s, pid %d, %s",
            __version__,
            cid,
            alias,
            vendor,
            ", ".join(f"{q}:{c}" for q, c in queues.items()) or "none",
            worker.config.concurrency,
            f"one of {self.processes} processes" if self.processes > 1 else "1 process",
            os.getpid(),
            election,
            extra={
                "event": "worker_started",
                "version": __version__,
                "client_id": cid,
                "database": alias,
                "vendor": vendor,
                "queues": dict(queues),
                "processes": self.processes,
                "leader_election": bool(worker.config.maintenance),
            },
        )

    def counts(self, client_id: int | None) -> Counter[str]:
        """Return a worker's result counts so far."""
        with self._lock:
            return Counter(self._counts.get(client_id) or {})

    def worker_stopped(self, worker: Worker) -> None:
        """Log the stop line with what the worker did."""
        cid = worker.client_id
        with self._lock:
            counts = self._counts.pop(cid, None) or Counter()
            since = self._since.pop(cid, None)
        uptime = time.monotonic() - since if since is not None else 0.0
        worker_logger.info(
            "hopper worker stopped: client %s ran %d attempts in %.1fs: %d completed, "
            "%d failed (%d retried, %d discarded), %d canceled, %d snoozed%s",
            cid,
            sum(v for k, v in counts.items() if k != "failed"),
            uptime,
            counts["completed"],
            counts["failed"],
            counts["retryable"],
            counts["discarded"],
            counts["canceled"],
            counts["scheduled"],
            f", {worker.stranded} left to the rescue" if worker.stranded else "",
            extra={
                "event": "worker_stopped",
                "client_id": cid,
                "uptime": round(uptime, 3),
                "completed": counts["completed"],
                "failed": counts["failed"],
                "retried": counts["retryable"],
                "discarded": counts["discarded"],
                "canceled": counts["canceled"],
                "snoozed": counts["scheduled"],
                "stranded": worker.stranded,
            },
        )

    def ended(self, jobs: Sequence[JobRow]) -> None:
        """Nothing: the services log the jobs they end."""


_console: ConsoleSink | None = None


def configure(verbosity: int = 1, fmt: str = "text", processes: int = 1) -> ConsoleSink:
    """Set up the worker's console: the handler (unless configured) and the job-line sink."""
    global _console

    install_handler(verbosity, fmt)
    if _console is not None:
        remove_sink(_console)
    _console = ConsoleSink(verbosity, processes)
    add_sink(_console)
    return _console
