"""The PostgreSQL engine: psycopg 3 through Django's connection.

The class is composed from mixins (jobs, and everything else) that share the
query helpers of :mod:`~django_hopper.engine.postgres.support`; all SQL lives
in ``queries/*.sql``.
"""

from __future__ import annotations

from django_hopper.engine.base import EngineFeatures
from django_hopper.engine.postgres.batches import BatchesMixin
from django_hopper.engine.postgres.clients import ClientsMixin
from django_hopper.engine.postgres.history import PostgresPeriodicHistoryMixin
from django_hopper.engine.postgres.jobs import JobsMixin
from django_hopper.engine.postgres.leases import LeasesMixin
from django_hopper.engine.postgres.listener import ConnectionRoute
from django_hopper.engine.postgres.operator import OperatorMixin
from django_hopper.engine.postgres.passes import PassesMixin
from django_hopper.engine.postgres.pubsub import PubSubMixin
from django_hopper.engine.postgres.queues import QueuesMixin
from django_hopper.engine.postgres.stats import StatsMixin
from django_hopper.engine.postgres.steps import StepsMixin
from django_hopper.engine.postgres.streams import StreamsMixin
from django_hopper.engine.postgres.subjects import SubjectsMixin
from django_hopper.engine.postgres.workflows import WorkflowsMixin


class PostgresEngine(
    QueuesMixin,
    StatsMixin,
    JobsMixin,
    OperatorMixin,
    ClientsMixin,
    PostgresPeriodicHistoryMixin,
    BatchesMixin,
    WorkflowsMixin,
    LeasesMixin,
    StepsMixin,
    PassesMixin,
    PubSubMixin,
    StreamsMixin,
    SubjectsMixin,
):
    """Hopper on PostgreSQL: SKIP LOCKED claims, COPY inserts, LISTEN/NOTIFY wake-ups."""

    vendor = "postgresql"
    features = EngineFeatures(
        supports_copy=True,
        supports_listen=True,
        single_writer=False,
        supports_history_partitions=True,
        supports_concurrent_index_builds=True,
        supports_skip_locked=True,
        supports_json_indexes=True,
        supports_storage_parameters=True,
        supports_xid_streams=True,
        plans_prepared_claims=True,
    )

    def connection_route(self) -> ConnectionRoute:
        """Return where the alias's connection goes, to tell a pooler in front of it."""
        row = self._fetchone("listener.route", {})
        info = self.connection.connection.info
        return ConnectionRoute(
            host=str(info.host),
            client_port=int(info.port),
            server_port=None if row is None or row[0] is None else int(row[0]),
        )
