"""The Django admin for hopper: jobs live and in history, queues, batches and
workflows, resumable runs, clients and the leader, periodic jobs, subscriptions
and stream consumers.

Everything here is read-only through the ORM. The actions (retry, cancel,
delete, pause, resume, set limits, run now, reset) call :mod:`django_hopper.api`,
:mod:`django_hopper.queues`, :mod:`django_hopper.periodic`,
:mod:`django_hopper.pubsub` and :mod:`django_hopper.streams`, the functions
user code calls, so that a rule such as "a running job cannot be deleted" is
written once, in the engine, and the admin can never take a shortcut around it.
What the admin shows and does is described in docs/admin.md.
"""

from django_hopper.admin import batches, cluster, jobs, periodic, pubsub, queues, runs

__all__ = ["batches", "cluster", "jobs", "periodic", "pubsub", "queues", "runs"]
