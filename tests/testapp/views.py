"""Views the end-to-end tests call through Django's test client."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from django_hopper import lease_job
from django_hopper.exceptions import JobNotClaimable, JobRunning
from tests.testapp.models import Effect


def take_job(request: HttpRequest, job_id: str) -> JsonResponse:
    """Take a job by ID and do its work here: the effect row and the completion
    commit together, or neither does. 409 when a worker (or anyone) has it."""
    try:
        with transaction.atomic(), lease_job(job_id, skip_locked=True) as lease:
            if lease is None:
                return JsonResponse({"taken": False, "why": "locked"}, status=409)
            Effect.objects.create(job_id=lease.id, fence=lease.fence, note="view")
            lease.complete({"by": "view"})
    except (JobRunning, JobNotClaimable) as exc:
        return JsonResponse({"taken": False, "why": type(exc).__name__}, status=409)
    return JsonResponse({"taken": True, "fence": lease.fence})
