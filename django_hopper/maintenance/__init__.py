"""Leader election and the leader's services (rescue, scheduling, expiry, pruning, ...).

One class per service, each with one ``interval`` (seconds) and ``run_once()``:
see :func:`default_services` for the list the leader runs.
"""

from django_hopper.maintenance.base import Service
from django_hopper.maintenance.history import HistoryIndexer, HistoryPruner, Vacuumer
from django_hopper.maintenance.leader import Elector, Maintainer
from django_hopper.maintenance.periodic import PeriodicEnqueuer, PeriodicRunResult
from django_hopper.maintenance.services import (
    Ager,
    ClientPruner,
    ExpiredJobDiscarder,
    LeaseExpirer,
    Rescuer,
    Scheduler,
    StreamPruner,
    StreamPumper,
    WorkflowSweeper,
    default_services,
)

__all__ = [
    "Ager",
    "ClientPruner",
    "Elector",
    "ExpiredJobDiscarder",
    "HistoryIndexer",
    "HistoryPruner",
    "LeaseExpirer",
    "Maintainer",
    "PeriodicEnqueuer",
    "PeriodicRunResult",
    "Rescuer",
    "Scheduler",
    "Service",
    "StreamPruner",
    "StreamPumper",
    "Vacuumer",
    "WorkflowSweeper",
    "default_services",
]
