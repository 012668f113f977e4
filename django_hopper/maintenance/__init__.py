"""Leader election and the leader's services (rescue, scheduling, expiry, pruning)."""

from django_hopper.maintenance.leader import Elector, Maintainer
from django_hopper.maintenance.services import (
    Ager,
    ClientPruner,
    ExpiredJobDiscarder,
    HistoryIndexService,
    HistoryRetentionService,
    JobsUpkeepService,
    Periodic,
    Rescuer,
    Scheduler,
    Service,
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
    "Maintainer",
    "Periodic",
    "Rescuer",
    "Scheduler",
    "Service",
    "default_services",
]
