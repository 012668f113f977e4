"""Resumable test jobs (tests/resumable). Their Effect rows prove which steps ran."""

from __future__ import annotations

import time
from typing import Any

from django_hopper.runs import Pass, Run, resumable


def _effect(run: Run, note: str) -> str:
    from django.db import transaction

    from tests.testapp.models import Effect

    with transaction.atomic():
        Effect.objects.create(job_id=run.job_id, fence=run.context.job.fence, note=note)
    return note


@resumable(max_attempts=20)
def rs_pages(run: Run, pages: int, hold: float = 0.0) -> Pass:
    """One page per pass: steps a and b write effects; step c holds on page 1's first try."""
    page = run.cursor or 0
    run.step("a", lambda: _effect(run, f"p{page}-a"))
    run.step("b", lambda: _effect(run, f"p{page}-b"))

    def c() -> Any:
        if page == 1 and run.context.attempt == 1 and hold:
            time.sleep(hold)
        return _effect(run, f"p{page}-c")

    run.step("c", c)
    run.count("pages")
    if page + 1 >= pages:
        return Pass(done=True)
    return Pass(cursor=page + 1)


@resumable(lease=1.0)
def rs_dies(run: Run) -> Pass:
    """One pass; the driving process dies after step a when HOPPER_TEST_DIE is set."""
    import os

    run.step("a", lambda: _effect(run, "a"))
    if os.environ.get("HOPPER_TEST_DIE"):
        os._exit(9)
    run.step("b", lambda: _effect(run, "b"))
    return Pass(done=True)
