"""HopperBackend: Django's Tasks API stored as hopper jobs, and read back from them.

A task is stored as a hopper job: kind = the task's import path, args as
hopper stores them (``{"args": [...], "kwargs": {...}}``), and a
``django_task`` entry in the job's metadata that marks it as a task and says
how to rebuild the ``Task`` (backend alias, priority, queue, ``run_after``,
hopper options). Enqueue inserts on the Django connection of the backend's
database, so the job commits or rolls back with the caller's transaction.
Results are read back from the job, live or from history, so ``get_result``
works from any process.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from django_hopper import signals, validation
from django_hopper.conf import hopper_settings
from django_hopper.engine import get_engine
from django_hopper.engine.params import JobInsertOpts, JobInsertParams
from django_hopper.exceptions import InvalidJob
from django_hopper.registry import resolve
from django_hopper.signals import job_enqueued
from django_hopper.tasks.errors import task_errors
from django_hopper.tasks_compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
)
from django_hopper.types import ConflictAction

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import JobRow

#: The metadata key that marks a job as a Django task and describes its Task.
META_KEY = "django_task"

#: Attempts a task gets unless OPTIONS or the task say otherwise: one, as on
#: every other Tasks backend (the Tasks API has no retry policy of its own).
DEFAULT_MAX_ATTEMPTS = 1

#: The keys HopperBackend understands in ``OPTIONS``.
OPTION_KEYS = frozenset({"database", "max_attempts", "timeout", "archive"})

#: Hopper options a task may carry, with their defaults (fields of HopperTask).
HOPPER_FIELDS: dict[str, Any] = {
    "max_attempts": None,
    "timeout": None,
    "unique_key": None,
    "unique_finished": (),
    "ordering_key": None,
    "partition_key": None,
    "tags": (),
    "ttl": None,
    "archive": None,
}

_STATUS = {
    "pending": TaskResultStatus.READY,
    "available": TaskResultStatus.READY,
    "scheduled": TaskResultStatus.READY,
    "retryable": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "canceled": TaskResultStatus.FAILED,
    "discarded": TaskResultStatus.FAILED,
}

# ---------------------------------------------------------------------------
# The task class: Django's Task plus hopper's options


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HopperTask(Task):  # type: ignore[misc,unused-ignore]
    """A ``Task`` that also carries hopper options, set through the Tasks API.

    HopperBackend makes it the ``task_class``, so ``@task(unique_key=..., tags=...)``
    works where ``@task`` forwards extra keywords to the task class (Django 6.1,
    the backport); ``using(...)`` accepts the same options per enqueue, and
    :func:`hopper_options` converts a plain ``Task`` on any version. Every option
    defaults to "not set", so a HopperTask without options is an ordinary task.
    """

    #: Attempts allowed (failures retry with hopper's backoff); None: OPTIONS, else 1.
    max_attempts: int | None = None
    #: Seconds one attempt may run; None: OPTIONS, else ``HOPPER["JOB_TIMEOUT"]``.
    timeout: float | None = None
    #: While a live job of this task holds the key, enqueue returns it instead.
    unique_key: str | None = None
    #: Finished states in which a job in history with the key is a duplicate too.
    unique_finished: tuple[str, ...] = ()
    #: Runs the task one at a time with other jobs of the same key in its queue.
    ordering_key: str | None = None
    #: The key a queue's partition limit counts by.
    partition_key: str | None = None
    #: Labels for the admin and listings.
    tags: tuple[str, ...] = ()
    #: Seconds after enqueue when a task still waiting is discarded.
    ttl: float | None = None
    #: Keep the completed job in history; None: OPTIONS, else ``HOPPER["ARCHIVE_COMPLETED"]``.
    archive: bool | None = None

    def __post_init__(self) -> None:
        """Normalize sequences and durations so that equal options compare equal."""
        for name in ("tags", "unique_finished"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value) if value is not None else ())
        for name in ("timeout", "ttl"):
            value = getattr(self, name)
            if isinstance(value, dt.timedelta):
                object.__setattr__(self, name, value.total_seconds())
        # Not super(): slots=True makes a new class, which the zero-argument form misses.
        Task.__post_init__(self)

    def using(  # type: ignore[override]
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: dt.datetime | None = None,
        backend: str | None = None,
        **hopper: Any,
    ) -> HopperTask:
        """Return a copy with other Tasks API defaults and/or other hopper options."""
        unknown = set(hopper) - set(HOPPER_FIELDS)
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
        new: HopperTask = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        if hopper:
            new = dataclasses.replace(new, **hopper)
        return new

    def hopper_options(self) -> dict[str, Any]:
        """Return the hopper options that differ from their defaults (JSON values)."""
        return {
            name: list(value) if isinstance(value, tuple) else value
            for name, default in HOPPER_FIELDS.items()
            if (value := getattr(self, name)) != default
        }


def hopper_options(task: Task, **options: Any) -> HopperTask:
    """Return ``task`` with hopper options (unique key, tags ...), on any Django version.

    For tasks declared with plain ``@task`` where the decorator does not pass
    extra keywords to the backend's task class, or whose backend is not hopper's::

        send_digest_once = hopper_options(send_digest, unique_key="digest")
        send_digest_once.enqueue(user_id)
    """
    if isinstance(task, HopperTask):
        return task.using(**options)
    unknown = set(options) - set(HOPPER_FIELDS)
    if unknown:
        raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
    base = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    return HopperTask(**base, **options)


# ---------------------------------------------------------------------------
# The backend


class HopperBackend(BaseTaskBackend):  # type: ignore[misc,unused-ignore]
    """Tasks stored and run as hopper jobs: durable, transactional, with results.

    ``OPTIONS``: ``database`` (alias; default ``HOPPER["DATABASE"]``),
    ``max_attempts`` (default 1), ``timeout`` (seconds per attempt) and
    ``archive`` (keep completed tasks in history; default
    ``HOPPER["ARCHIVE_COMPLETED"]``). Each task can override the last three.
    """

    task_class = HopperTask

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    alias: str
    queues: set[str]
    options: dict[str, Any]

    @property
    def database(self) -> str:
        """Return the database alias tasks are stored through (read at use, not at import)."""
        alias = self.options.get("database")
        if alias:
            return str(alias)
        return str(hopper_settings.DATABASE)

    def engine(self) -> BaseEngine:
        """Return the hopper engine of the backend's database."""
        return get_engine(self.database)

    # -- validation -----------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Refuse a task hopper cannot run, with the Tasks API's InvalidTask.

        On top of Django's checks: a worker imports the task by its module
        path, so it cannot live in ``__main__``; the queue name and the hopper
        options must be ones hopper accepts.
        """
        super().validate_task(task)
        func = task.func
        if getattr(func, "__module__", None) in (None, "__main__"):
            raise InvalidTask(
                "Task function must be defined in an importable module, not __main__: "
                "a worker imports it by its module path."
            )
        if len(task.module_path) > 255:
            raise InvalidTask("Task module path must be at most 255 characters.")
        try:
            self._hopper_values(task)
        except InvalidJob as exc:
            raise InvalidTask(str(exc)) from None

    def _hopper_values(self, task: Task) -> dict[str, Any]:
        """Return the checked hopper values of a task: queue, attempts and its options."""
        values: dict[str, Any] = {"queue": validation.queue_name(task.queue_name, "queue_name")}
        get = getattr
        max_attempts = get(task, "max_attempts", None)
        if max_attempts is None:
            max_attempts = self.options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
        values["max_attempts"] = validation.max_attempts(max_attempts)
        values["unique_key"] = validation.key(get(task, "unique_key", None), "unique_key")
        values["unique_finished"] = validation.unique_finished(get(task, "unique_finished", ()))
        values["ordering_key"] = validation.key(get(task, "ordering_key", None), "ordering_key")
        values["partition_key"] = validation.key(get(task, "partition_key", None), "partition_key")
        values["tags"] = validation.tags(get(task, "tags", ()))
        ttl = get(task, "ttl", None)
        values["ttl"] = None if ttl is None else validation.positive_duration(ttl, "ttl")
        timeout = get(task, "timeout", None)
        if timeout is not None:
            validation.positive_duration(timeout, "timeout")
        archive = get(task, "archive", None)
        if archive is not None and not isinstance(archive, bool):
            raise InvalidJob(f"archive must be True, False or None, not {archive!r}")
        return values

    def _check_importable(self, task: Task) -> None:
        """Refuse a task a worker would not find at its module path.

        Checked at enqueue, not in ``validate_task``: while ``@task`` decorates,
        the module attribute does not exist yet.
        """
        try:
            found = import_string(task.module_path)
        except ImportError:
            found = None
        if not isinstance(found, Task) or found.func is not task.func:
            raise InvalidTask(
                f"Task {task.module_path!r} must be importable at module level as the @task "
                "object itself: a worker imports it by that path."
            )

    # -- enqueue --------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Insert the task as a hopper job in the caller's transaction; return its result.

        With a ``unique_key`` held by a live job, nothing is inserted and the
        existing job's result is returned (no ``task_enqueued`` then: nothing
        was enqueued).
        """
        self.validate_task(task)
        self._check_importable(task)
        params = self.insert_params(task, args, kwargs)
        if signals.job_enqueuing.receivers:
            # As for ``.enqueue()``: tracing opens its enqueue span here and
            # stores its context with the job, so the run continues the trace.
            params = signals.enqueuing(resolve(task.module_path), [params])[0]
        engine = self.engine()
        inserted = engine.job_insert_many(
            [params], JobInsertOpts(notify=True, on_conflict=ConflictAction.SKIP)
        )[0]
        row = inserted.job
        result = self.result_from_row(row, task=None if inserted.duplicate else task)
        _send_job_enqueued(task, row, inserted.duplicate)
        if not inserted.duplicate:
            task_enqueued.send(type(self), task_result=result)
        return result

    def insert_params(
        self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> JobInsertParams:
        """Return the hopper insert of one task call (nothing is written).

        Arguments go through Django's JSON normalization first (TypeError
        "Unsupported type", as on every Tasks backend), then hopper's checks.
        Public so that batch and workflow code can insert tasks as hopper does.
        """
        stored = {
            "args": validation.json_normalize(normalize_json(list(args)), "args"),
            "kwargs": validation.json_normalize(normalize_json(dict(kwargs)), "kwargs"),
        }
        try:
            values = self._hopper_values(task)
        except InvalidJob as exc:
            raise InvalidTask(str(exc)) from None
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)  # USE_TZ=False: the project's zone
        spec: dict[str, Any] = {
            "backend": self.alias,
            "takes_context": bool(task.takes_context),
            "priority": task.priority,
            "queue_name": task.queue_name,
            "run_after": run_after.isoformat() if run_after is not None else None,
        }
        if isinstance(task, HopperTask) and (opts := task.hopper_options()):
            spec["options"] = opts
        return JobInsertParams(
            kind=task.module_path,
            queue=values["queue"],
            priority=int(task.priority),
            max_attempts=values["max_attempts"],
            scheduled_at=run_after,
            args=stored,
            metadata={META_KEY: spec},
            tags=values["tags"],
            unique_key=values["unique_key"],
            unique_finished=values["unique_finished"],
            ordering_key=values["ordering_key"],
            partition_key=values["partition_key"],
            ttl=values["ttl"],
        )

    # -- results --------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """Return the task's result as its job is now, live or from history.

        Raises TaskResultDoesNotExist for an ID that is not a job of a task of
        this backend (unknown, malformed, a plain hopper job, another alias's).
        Inside a transaction it reads that transaction's view.
        """
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        row = self.engine().job_get(job_id)
        spec = task_spec(row) if row is not None else None
        if row is None or spec is None or spec.get("backend") != self.alias:
            raise TaskResultDoesNotExist(result_id)
        return self.result_from_row(row)

    def task_from_row(self, row: JobRow) -> Task:
        """Rebuild the Task a job was enqueued with, from its import path and metadata.

        A stored task stays readable whatever changed since it was enqueued:
        one whose import path no longer leads to a Task (its module or function
        was renamed or removed) comes back as a stand-in Task of that path whose
        function raises the ImportError, and one the current settings would
        refuse (its queue left ``QUEUES``) comes back as stored, not validated
        again.
        """
        spec = task_spec(row) or {}
        run_after = spec.get("run_after")
        changes: dict[str, Any] = {
            "priority": spec.get("priority", row.priority),
            "queue_name": spec.get("queue_name", row.queue),
            "run_after": dt.datetime.fromisoformat(run_after) if run_after else None,
            "backend": spec.get("backend", self.alias),
        }
        base, problem = _import_task(row.kind)
        if base is None:
            return _stale_task(row.kind, problem, changes)
        options = dict(spec.get("options") or {})
        if isinstance(base, HopperTask) or options:
            hopper = {name: options.get(name, d) for name, d in HOPPER_FIELDS.items()}
            if not isinstance(base, HopperTask):
                base = hopper_options(base, **hopper)
            changes.update(hopper)
        try:
            return dataclasses.replace(base, **changes)
        except InvalidTask:
            fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
            return _unvalidated(type(base), {**fields, **changes})

    def result_from_row(self, row: JobRow, task: Task | None = None) -> TaskResult:
        """Return a TaskResult reflecting a job row (``task``: the Task, if known).

        Hopper keeps the time of the latest claim only, so ``started_at`` and
        ``last_attempted_at`` are both the latest attempt's start;
        ``worker_ids`` has one entry per attempt (see :func:`_worker_ids`).
        """
        spec = task_spec(row) or {}
        if task is None:
            task = self.task_from_row(row)
        status = _STATUS[row.state]
        stored = row.args if isinstance(row.args, dict) else {}
        result = TaskResult(
            task=task,
            id=str(row.id),
            status=status,
            enqueued_at=row.created_at,
            started_at=row.attempted_at,
            finished_at=row.finalized_at if status in _FINISHED else None,
            last_attempted_at=row.attempted_at,
            args=list(stored.get("args") or []),
            kwargs=dict(stored.get("kwargs") or {}),
            backend=spec.get("backend", self.alias),
            errors=task_errors(row, task),
            worker_ids=_worker_ids(row),
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", row.output)
        return result

    # -- system checks --------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Report OPTIONS hopper does not understand and queues no worker works by default."""
        errors: list[checks.CheckMessage] = []
        for key in sorted(set(self.options) - OPTION_KEYS):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has the unknown key {key!r}.",
                    hint=f"HopperBackend understands {', '.join(sorted(OPTION_KEYS))}.",
                    id="hopper.E701",
                )
            )
        if self.database not in connections.settings:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] stores tasks on the unknown database "
                    f"{self.database!r}.",
                    id="hopper.E702",
                )
            )
        elif self.database != hopper_settings.DATABASE:
            errors.append(
                checks.Warning(
                    f"TASKS[{self.alias!r}] stores tasks on the database {self.database!r}, "
                    f"but hopper_worker works HOPPER['DATABASE'] ({hopper_settings.DATABASE!r}) "
                    "by default.",
                    hint=(
                        f"Run a worker for it: manage.py hopper_worker --database "
                        f"{self.database} (the database needs hopper's tables: migrate it)."
                    ),
                    id="hopper.W702",
                )
            )

        try:
            validation.max_attempts(self.options.get("max_attempts", DEFAULT_MAX_ATTEMPTS))
            if self.options.get("timeout") is not None:
                validation.positive_duration(self.options["timeout"], "timeout")
        except InvalidJob as exc:
            errors.append(checks.Error(f"TASKS[{self.alias!r}]: {exc}", id="hopper.E703"))
        worked = set(dict(hopper_settings.QUEUES))
        for queue in sorted(self.queues - worked):
            errors.append(
                checks.Warning(
                    f"TASKS[{self.alias!r}] has the queue {queue!r}, which hopper_worker does "
                    "not work by default.",
                    hint="Add it to HOPPER['QUEUES'] or start a worker with --queues.",
                    id="hopper.W701",
                )
            )
        return errors


_FINISHED = frozenset({TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED})


def task_spec(row: JobRow) -> dict[str, Any] | None:
    """Return the task description in a job's metadata, or None for a plain hopper job."""
    meta = row.metadata
    spec = meta.get(META_KEY) if isinstance(meta, dict) else None
    return spec if isinstance(spec, dict) else None


def _worker_ids(row: JobRow) -> list[str]:
    """Return the ID of the worker (hopper client) that ran each attempt, in order.

    A failed attempt's recorded error names its client; the latest attempt's
    is the claim's ``attempted_by``. An attempt with neither (an error stored
    by an earlier release) gets the latest claim's, and an attempt run under
    a job lease, which no client holds, ``hopper-lease``.
    """
    if row.attempted_at is None or row.attempt <= 0:
        return []
    latest = str(row.attempted_by) if row.attempted_by is not None else "hopper-lease"
    by_attempt = {e.attempt: str(e.by) for e in row.errors if e.by is not None}
    ids = [by_attempt.get(n, latest) for n in range(1, row.attempt)]
    return [*ids, latest]


def _import_task(kind: str) -> tuple[Task | None, ImportError | None]:
    """Return the Task at an import path, or None and the ImportError that says why not."""
    try:
        found = import_string(kind)
    except ImportError as exc:
        return None, exc
    except Exception as exc:  # the module itself fails to import
        return None, ImportError(f"importing {kind!r} failed: {type(exc).__name__}: {exc}")
    if not isinstance(found, Task):
        return None, ImportError(f"{kind!r} is no longer a task (it is {type(found).__name__})")
    return found, None


def _stale_task(kind: str, problem: ImportError | None, fields: dict[str, Any]) -> Task:
    """Return a stand-in Task for an import path that no longer leads to one.

    Its ``module_path`` is the stored path and its function raises the
    ImportError, so the result reads as the task that could not run.
    """
    module, _, name = kind.rpartition(".")
    error = problem or ImportError(f"{kind!r} cannot be imported")

    def stale(*args: Any, **kwargs: Any) -> Any:
        raise error

    stale.__module__ = module
    stale.__name__ = stale.__qualname__ = name
    stale.hopper_import_error = error  # type: ignore[attr-defined]
    return _unvalidated(Task, {**fields, "func": stale, "takes_context": False})


def _unvalidated(cls: type[Task], fields: dict[str, Any]) -> Task:
    """Return a Task built from stored fields without the checks of ``__post_init__``.

    Validation guards what is enqueued; a task already stored is read back
    as it was, even where today's settings would refuse it.
    """
    task: Task = object.__new__(cls)
    for f in dataclasses.fields(cls):
        object.__setattr__(task, f.name, fields.get(f.name, f.default))
    return task


def hopper_backend(alias: str) -> HopperBackend | None:
    try:
        backend = task_backends[alias]
    except Exception:
        return None
    return backend if isinstance(backend, HopperBackend) else None


def _send_job_enqueued(task: Task, row: JobRow, duplicate: bool) -> None:
    """Send hopper's ``job_enqueued`` too, so hopper-level receivers see tasks.

    Its sender is the job function the task's kind resolves to, as for any job.
    """
    jobs, duplicates = ([], [row]) if duplicate else ([row], [])
    job_enqueued.send(sender=resolve(task.module_path), jobs=jobs, duplicates=duplicates)
