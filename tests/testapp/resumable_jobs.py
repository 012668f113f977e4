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


# -- crash points for the pass-lease process tests (tests/resumable) -----------------
#
# HOPPER_TEST_HOLD names where a worker process holds (sleeps) so that the test can
# kill it there: "before_begin" (job_started, sent before the pass BEGINs) or
# "after_commit" (job_finished, sent once the pass committed and before its result
# is written). The hold happens once per job: a marker file in HOPPER_TEST_MARKS
# says the point was reached, and the test waits for it.


def _hold(point: str, job: Any) -> None:
    import os
    from pathlib import Path

    if os.environ.get("HOPPER_TEST_HOLD") != point or job.kind != rs_crash.kind:
        return
    marker = Path(os.environ["HOPPER_TEST_MARKS"]) / f"{point}-{job.id}"
    if marker.exists():
        return
    marker.write_text(str(os.getpid()))
    time.sleep(120)


def _on_started(sender: Any, job: Any, **kwargs: Any) -> None:
    _hold("before_begin", job)


def _on_finished(sender: Any, job: Any, **kwargs: Any) -> None:
    _hold("after_commit", job)


@resumable(lease=2.0, max_attempts=20)
def rs_crash(run: Run, pages: int = 2, hang: float = 0.0) -> Pass:
    """One page per pass, steps a and b writing effects; with ``hang``, step b of
    page 0 sleeps that long on its first try (a hung pass, whose lease expires)."""
    page = run.cursor or 0
    run.step("a", lambda: _effect(run, f"p{page}-a"))

    def b() -> str:
        if hang and page == 0 and run.context.attempt == 1:
            time.sleep(hang)
        return _effect(run, f"p{page}-b")

    run.step("b", b)
    run.count("pages")
    if page + 1 >= pages:
        return Pass(done=True)
    return Pass(cursor=page + 1)


def _connect() -> None:
    from django_hopper import signals

    signals.job_started.connect(_on_started, dispatch_uid="tests.rs_crash.started")
    signals.job_finished.connect(_on_finished, dispatch_uid="tests.rs_crash.finished")


_connect()
