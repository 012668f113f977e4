"""End to end: a job enqueued in a transaction runs once if it commits, never if it rolls back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import JobListParams
from django_hopper.worker import Worker
from tests.testapp import jobs
from tests.testapp.models import Effect


class Rollback(Exception):
    """Raised to roll the caller's transaction back."""


def test_a_job_enqueued_in_a_committed_atomic_runs_once_with_exactly_one_effect(
    tx_engine: BaseEngine, make_worker: Callable[..., Worker]
) -> None:
    with transaction.atomic():
        Effect.objects.create(job_id="00000000-0000-0000-0000-000000000000", note="caller")
        handle = jobs.rt_effect.enqueue()

    assert make_worker().run_once() == 1
    assert make_worker().run_once() == 0  # nothing left to run a second time

    row = tx_engine.job_get(handle.id)
    assert row is not None and row.state == "completed"
    assert list(Effect.objects.filter(job_id=handle.id).values_list("fence", flat=True)) == [
        row.fence
    ]
    assert Effect.objects.filter(note="caller").count() == 1


def test_a_job_enqueued_in_a_rolled_back_atomic_never_exists_and_has_no_effect(
    tx_engine: BaseEngine, make_worker: Callable[..., Worker]
) -> None:
    handles: list[Any] = []
    with pytest.raises(Rollback), transaction.atomic():
        Effect.objects.create(job_id="00000000-0000-0000-0000-000000000000", note="caller")
        handles.append(jobs.rt_effect.enqueue())
        raise Rollback

    assert make_worker().run_once() == 0

    (handle,) = handles
    assert tx_engine.job_get(handle.id) is None
    assert tx_engine.job_list(JobListParams(limit=10)) == []
    assert not Effect.objects.exists()
