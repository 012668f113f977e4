"""Leader election and the leader's services (rescue, scheduling, expiry, pruning)."""

from django_hopper.maintenance.leader import Elector, Maintainer
from django_hopper.maintenance.services import (
    ClientPruner,
    ExpiredJobDiscarder,
    Rescuer,
    Scheduler,
    Service,
    default_services,
)

__all__ = [
    "ClientPruner",
    "Elector",
    "ExpiredJobDiscarder",
    "Maintainer",
    "Rescuer",
    "Scheduler",
    "Service",
    "default_services",
]
