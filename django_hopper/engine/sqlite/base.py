"""The SQLite engine: sqlite3 through Django's connection, one writer at a time."""

from __future__ import annotations

from django_hopper.engine.base import EngineFeatures
from django_hopper.engine.sqlite.batches import BatchesMixin
from django_hopper.engine.sqlite.clients import ClientsMixin
from django_hopper.engine.sqlite.history import SQLitePeriodicHistoryMixin
from django_hopper.engine.sqlite.jobs import JobsMixin
from django_hopper.engine.sqlite.leases import LeasesMixin
from django_hopper.engine.sqlite.operator import OperatorMixin
from django_hopper.engine.sqlite.passes import PassesMixin
from django_hopper.engine.sqlite.pubsub import PubSubMixin
from django_hopper.engine.sqlite.queues import QueuesMixin
from django_hopper.engine.sqlite.stats import StatsMixin
from django_hopper.engine.sqlite.steps import StepsMixin
from django_hopper.engine.sqlite.streams import StreamsMixin
from django_hopper.engine.sqlite.subjects import SubjectsMixin
from django_hopper.engine.sqlite.workflows import WorkflowsMixin


class SQLiteEngine(
    QueuesMixin,
    StatsMixin,
    JobsMixin,
    OperatorMixin,
    ClientsMixin,
    SQLitePeriodicHistoryMixin,
    BatchesMixin,
    WorkflowsMixin,
    LeasesMixin,
    StepsMixin,
    PassesMixin,
    PubSubMixin,
    StreamsMixin,
    SubjectsMixin,
):
    """The embedded engine: polling for wake-ups, a single writer for exclusivity.

    Every method runs on the Django connection of the engine's alias, so inside
    ``transaction.atomic()`` it joins the caller's transaction.
    """

    vendor = "sqlite"
    features = EngineFeatures(single_writer=True)
