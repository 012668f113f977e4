"""django_hopper: a durable, transactional job queue on the database you already run.

The public API is imported lazily so that importing ``django_hopper`` (as
``INSTALLED_APPS`` does) touches neither models nor settings.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

_LAZY = {
    # name -> module; the enqueue API
    "job": "django_hopper.jobs",
    "JobFunction": "django_hopper.jobs",
    "JobHandle": "django_hopper.handle",
    "PreparedJob": "django_hopper.jobs",
    "enqueue_many": "django_hopper.jobs",
    "aenqueue_many": "django_hopper.jobs",
    "resolve": "django_hopper.registry",
    # operator functions
    "get_job": "django_hopper.api",
    "cancel_job": "django_hopper.api",
    "retry_job": "django_hopper.api",
    "delete_job": "django_hopper.api",
    "list_jobs": "django_hopper.api",
    "job_logs": "django_hopper.api",
    "erase_subject": "django_hopper.api",
    "subject_erasures": "django_hopper.api",
    # job leases: take a job by ID, finalize it in your transaction
    "lease_job": "django_hopper.job_leases",
    "claim_job": "django_hopper.job_leases",
    "resume_lease": "django_hopper.job_leases",
    "JobLease": "django_hopper.job_leases",
    # queue controls
    "pause_queue": "django_hopper.queues",
    "resume_queue": "django_hopper.queues",
    "set_queue_limits": "django_hopper.queues",
    "list_queues": "django_hopper.queues",
    "retry_ordering_key": "django_hopper.queues",
    "stats": "django_hopper.queues",
    # batches and workflows
    "Batch": "django_hopper.batches",
    "get_batch": "django_hopper.batches",
    "Workflow": "django_hopper.workflows",
    "get_workflow": "django_hopper.workflows",
    # resumable long jobs (run / pass / step)
    "resumable": "django_hopper.runs",
    "list_runs": "django_hopper.runs",
    "Pass": "django_hopper.runs",
    "Run": "django_hopper.runs",
    # pub/sub and streams
    "subscribe": "django_hopper.pubsub",
    "publish": "django_hopper.pubsub",
    "append": "django_hopper.streams",
    "consume": "django_hopper.streams",
    "seek": "django_hopper.streams",
    "read": "django_hopper.streams",
    # subscription and stream-consumer management
    "pause_subscription": "django_hopper.pubsub",
    "resume_subscription": "django_hopper.pubsub",
    "unsubscribe": "django_hopper.pubsub",
    "pause_consumer": "django_hopper.streams",
    "resume_consumer": "django_hopper.streams",
    "reset_consumer": "django_hopper.streams",
    "delete_consumer": "django_hopper.streams",
    "consumer_lag": "django_hopper.streams",
    # periodic slots
    "run_periodic_now": "django_hopper.periodic",
    "disable_periodic": "django_hopper.periodic",
    "enable_periodic": "django_hopper.periodic",
    "periodic_states": "django_hopper.periodic",
    # the public types and vocabulary (django_hopper.types)
    "JobRow": "django_hopper.types",
    "AttemptError": "django_hopper.types",
    "AttemptLog": "django_hopper.types",
    "Progress": "django_hopper.types",
    "JobState": "django_hopper.types",
}

# Spelled out (not derived from _LAZY) so that linters and type checkers read it.
__all__ = [
    "AttemptError",
    "AttemptLog",
    "Batch",
    "JobFunction",
    "JobHandle",
    "JobLease",
    "JobRow",
    "JobState",
    "Pass",
    "PreparedJob",
    "Progress",
    "Run",
    "Workflow",
    "__version__",
    "aenqueue_many",
    "append",
    "cancel_job",
    "claim_job",
    "consume",
    "consumer_lag",
    "delete_consumer",
    "delete_job",
    "disable_periodic",
    "enable_periodic",
    "enqueue_many",
    "erase_subject",
    "get_batch",
    "get_job",
    "get_workflow",
    "job",
    "job_logs",
    "lease_job",
    "list_jobs",
    "list_queues",
    "list_runs",
    "pause_consumer",
    "pause_queue",
    "pause_subscription",
    "periodic_states",
    "publish",
    "read",
    "reset_consumer",
    "resolve",
    "resumable",
    "resume_consumer",
    "resume_lease",
    "resume_queue",
    "resume_subscription",
    "retry_job",
    "retry_ordering_key",
    "run_periodic_now",
    "seek",
    "set_queue_limits",
    "stats",
    "subject_erasures",
    "subscribe",
    "unsubscribe",
]

if TYPE_CHECKING:  # let type checkers and IDEs see the lazy names
    from django_hopper.api import (
        cancel_job,
        delete_job,
        erase_subject,
        get_job,
        job_logs,
        list_jobs,
        retry_job,
        subject_erasures,
    )
    from django_hopper.batches import Batch, get_batch
    from django_hopper.handle import JobHandle
    from django_hopper.job_leases import JobLease, claim_job, lease_job, resume_lease
    from django_hopper.jobs import (
        JobFunction,
        PreparedJob,
        aenqueue_many,
        enqueue_many,
        job,
    )
    from django_hopper.periodic import (
        disable_periodic,
        enable_periodic,
        periodic_states,
        run_periodic_now,
    )
    from django_hopper.pubsub import (
        pause_subscription,
        publish,
        resume_subscription,
        subscribe,
        unsubscribe,
    )
    from django_hopper.queues import (
        list_queues,
        pause_queue,
        resume_queue,
        retry_ordering_key,
        set_queue_limits,
        stats,
    )
    from django_hopper.registry import resolve
    from django_hopper.runs import Pass, Run, list_runs, resumable
    from django_hopper.streams import (
        append,
        consume,
        consumer_lag,
        delete_consumer,
        pause_consumer,
        read,
        reset_consumer,
        resume_consumer,
        seek,
    )
    from django_hopper.types import AttemptError, AttemptLog, JobRow, JobState, Progress
    from django_hopper.workflows import Workflow, get_workflow


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_hopper' has no attribute {name!r}")

    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
