"""Leader election and the leader's services (rescue, scheduling, expiry, pruning)."""

from django_hopper.maintenance.leader import Elector, Maintainer
from django_hopper.maintenance.services import (
    Ager,
    ClientPruner,
    ExpiredJobDiscarder,
    HistoryIndexService,
    HistoryRetentionService,
    JobsUpkeepService,
    LeaseExpirer,
    Periodic,
    Rescuer,
    Scheduler,
    Service,
    StreamPumper,
    StreamRetentionService,
    WorkflowSweeper,
    default_services,
)

__all__ = [
    "Ager",
    "ClientPruner",
    "Elector",
    "ExpiredJobDiscarder",
    "HistoryIndexService",
    "HistoryRetentionService",
    "JobsUpkeepService",
    "LeaseExpirer",
    "Maintainer",
    "Periodic",
    "Rescuer",
    "Scheduler",
    "Service",
    "StreamPumper",
    "StreamRetentionService",
    "WorkflowSweeper",
    "default_services",
]
