"""Hopper's own exceptions.

Engines translate driver errors into these at their boundary, so code above
the engine never sees a psycopg or sqlite3 exception. Input errors subclass
``ValueError`` so that callers validating forms can catch them as such, and
database errors subclass Django's (``django.db.DatabaseError``, and
``django.db.OperationalError`` for a lost connection), so that code written for
the ORM catches hopper's failures with the ``except`` clauses it already has.
"""

from __future__ import annotations

from django.db import DatabaseError as DjangoDatabaseError
from django.db import OperationalError as DjangoOperationalError


class HopperError(Exception):
    """Base class of every hopper exception."""


class InvalidJob(HopperError, ValueError):
    """An input to an API call is invalid; nothing was written.

    ``field`` names the offending field, when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownJobKind(InvalidJob):
    """A job kind that no registered job function answers to."""


class UnknownQueue(InvalidJob):
    """A queue name that is empty, malformed or not known where it must be."""


class NotFound(HopperError, LookupError):
    """The job (or batch, workflow, queue ...) does not exist."""


class JobRunning(HopperError):
    """The operation is not allowed on a running job."""


class UniqueConflict(HopperError):
    """A live job already holds the same kind and unique key."""


def unique_conflict(detail: str) -> UniqueConflict:
    """Return the error both engines raise when a live job holds the kind and unique key."""
    return UniqueConflict(f"a live job already holds this kind and unique key ({detail})")


def duplicate_id(detail: str) -> InvalidJob:
    """Return the error both engines raise for a job ID a live job already holds.

    A caller-chosen ID that collides is a bad input, not a unique-key
    conflict: no unique key was given, and retrying with the same ID fails
    the same way.
    """
    return InvalidJob(f"a job with this id already exists ({detail})", field="id")


class JobFenced(HopperError):
    """The claim or lease no longer owns the job."""


class JobNotClaimable(HopperError):
    """The job cannot be claimed now (pending, expired, paused, ordered, finished)."""


class JobErased(HopperError):
    """The job's data was erased (``erase_subject``): it cannot run again."""


class JobLocked(HopperError):
    """Another transaction holds the job's row and the caller asked not to wait."""


class NotSupported(HopperError):
    """The engine does not implement an optional capability."""


class DatabaseError(HopperError, DjangoDatabaseError):
    """A database error that hopper could not attribute to the caller's input.

    Also a ``django.db.DatabaseError``: a caller that guards ORM work with
    ``except DatabaseError`` guards hopper's calls the same way.
    """


class DatabaseUnavailable(DatabaseError, DjangoOperationalError):
    """The database cannot serve the call for now.

    The connection was lost or could not be made (a server restart, a
    terminated backend) or, on SQLite, the file stayed locked past the busy
    timeout. Nothing about the request was wrong: the same call may succeed
    later on a new connection, so long-running processes retry it with a backoff.
    """


class JobFailed(HopperError):
    """An awaited job finished without completing (canceled or discarded)."""

    def __init__(self, message: str, *, job: object = None) -> None:
        super().__init__(message)
        self.job = job


class JobCanceled(Exception):
    """Raised inside a running job when its cancellation was requested.

    Deliberately not a HopperError subclass a job might catch by accident.
    """


class SchemaMismatch(HopperError):
    """The database's hopper schema and this code do not go together.

    Either migrations this code needs are not applied (run ``manage.py
    migrate django_hopper``), or the schema was migrated past what this code
    supports (deploy newer code). ``database`` is the schema's version,
    ``code`` the version this code is built for.
    """

    def __init__(self, message: str, *, database: int, code: int) -> None:
        super().__init__(message)
        self.database = database
        self.code = code


class HistoryIndexRepairError(DatabaseError):
    """A pass repaired what it could, but rebuilding some invalid indexes failed.

    Raised once the rest of the pass is done. ``result`` is the pass's
    :class:`~django_hopper.engine.params.HistoryIndexResult` (the failed indexes
    are in its ``invalid``), and ``failures`` maps each such index to its error.
    """

    def __init__(self, message: str, *, result: object, failures: dict[str, str]) -> None:
        super().__init__(message)
        self.result = result
        self.failures = failures
