"""Job functions shared by the test modules.

Append-only: several test modules (and worker processes started by tests,
through ``HOPPER["IMPORTS"]``) rely on these names and kinds. Add new
functions at the end; do not change or remove existing ones.
"""

from __future__ import annotations

import threading
from typing import Any

from django_hopper import job


@job
def noop() -> None:
    """Do nothing; the smallest job there is."""


@job
def add(a: int, b: int) -> int:
    """Return a sum, so a test can check the stored output."""
    return a + b


@job(queue="emails", priority=5, max_attempts=3)
def send_email(to: str, subject: str = "") -> dict[str, Any]:
    """A job with decorator options, to check they land on the row."""
    return {"to": to, "subject": subject}


@job
def fail(message: str = "boom") -> None:
    """Raise every time, so the job ends discarded."""
    raise RuntimeError(message)


@job(takes_context=True)
def with_context(context: Any, note: str = "") -> int:
    """Log a line through the context and return the attempt number."""
    context.log(f"attempt {context.attempt}: {note}")
    return int(context.attempt)


@job
async def async_add(a: int, b: int) -> int:
    """An ``async def`` job, run on the worker's event loop."""
    return a + b


# ---------------------------------------------------------------------------
# Runtime (worker) test jobs. Their Effect rows prove what ran, at which fence.


def _effect(context: Any, note: str = "") -> None:
    """Record that this claim ran, in the job's own transaction."""
    from django.db import transaction

    from tests.testapp.models import Effect

    with transaction.atomic():
        Effect.objects.create(job_id=context.job_id, fence=context.job.fence, note=note)


@job(takes_context=True, max_attempts=50)
def rt_effect(context: Any, seconds: float = 0.0) -> int:
    """Sleep, then record one effect; killing a worker mid-sleep loses nothing."""
    import time

    time.sleep(seconds)
    _effect(context)
    return int(context.job.fence)


@job(takes_context=True, max_attempts=3)
def rt_flaky(context: Any, failures: int = 1) -> str:
    """Fail the first ``failures`` attempts, then succeed."""
    context.log(f"attempt {context.attempt}")
    if context.attempt <= failures:
        raise ValueError(f"flaky failure {context.attempt}")
    return "ok"


@job(takes_context=True)
def rt_snooze_once(context: Any, delay: float = 0.0) -> str:
    """Snooze the first time it runs, complete the second time."""
    from tests.testapp.models import Effect

    if not Effect.objects.filter(job_id=context.job_id).exists():
        _effect(context, "snoozed")
        context.log("snoozing")
        context.snooze(delay, "waiting for something")
    return "woke"


@job
def rt_not_json() -> Any:
    """Return a value that cannot be stored as JSON."""
    return {1, 2, 3}


@job
def rt_returns_nul(nested: bool = False) -> Any:
    """Return a string with a NUL character, which PostgreSQL's jsonb cannot store."""
    return {"text": ["ok", "a\x00b"]} if nested else "a\x00b"


@job(timeout=0.3)
def rt_sleep_sync(seconds: float) -> str:
    """Ignore its timeout (a plain sleep): the worker must finalize it anyway."""
    import time

    time.sleep(seconds)
    return "late"


@job(timeout=0.3)
async def rt_sleep_async(seconds: float) -> str:
    """Time out inside the event loop."""
    import asyncio

    await asyncio.sleep(seconds)
    return "late"


@job(takes_context=True)
def rt_wait_cancel(context: Any, seconds: float = 30.0) -> str:
    """Wait cooperatively until cancelled (or ``seconds`` pass)."""
    import time

    _effect(context, "started")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        context.check_cancelled()
        time.sleep(0.02)
    return "not cancelled"


@job(takes_context=True)
async def rt_async_wait_cancel(context: Any, seconds: float = 30.0) -> str:
    """Wait on the event loop until cancelled through asyncio."""
    import asyncio

    from asgiref.sync import sync_to_async

    await sync_to_async(_effect)(context, "started")
    await asyncio.sleep(seconds)
    return "not cancelled"


@job(takes_context=True)
def rt_progress(context: Any, steps: int = 3) -> Any:
    """Record a step per iteration; return what the context saw."""
    stored = []
    for i in range(steps):
        stored.append(context.record_progress(f"step-{i}", {"i": i}))
    return {"stored": stored, "step": context.progress.step if context.progress else None}


@job(takes_context=True, max_attempts=50)
def rt_hold(context: Any, seconds: float = 1.0) -> str:
    """Sleep without an effect (a long-running job to interrupt)."""
    import time

    time.sleep(seconds)
    _effect(context, "held")
    return "held"


# ---------------------------------------------------------------------------
# Workflow and batch test jobs (issue 5). Each records an Effect whose note is
# "<step>" with its dependencies' outputs, so a test can check order and reads.


@job(takes_context=True, max_attempts=50)
def wf_step(context: Any, name: str, seconds: float = 0.0, fail: bool = False) -> dict[str, Any]:
    """Record that step ``name`` ran (after its reads), then return a value naming it."""
    import time

    from django.db import transaction

    from tests.testapp.models import Effect

    if seconds:
        time.sleep(seconds)
    if fail:
        raise RuntimeError(f"step {name} fails")
    reads = sorted(d.output["name"] for d in context.dependencies if d.output)
    with transaction.atomic():
        Effect.objects.create(job_id=context.job_id, fence=context.job.fence, note=name)
    return {"name": name, "reads": reads}


@job(takes_context=True, max_attempts=1)
def wf_fail(context: Any, name: str) -> None:
    """Fail at once and for good: the job ends discarded."""
    raise RuntimeError(f"step {name} fails")


@job(takes_context=True, max_attempts=50)
def wf_callback(context: Any, which: str) -> str:
    """A batch or workflow callback: record it with the batch ID from its metadata."""
    from tests.testapp.models import Effect

    batch_id = context.metadata.get("batch_id", "")
    note = f"{which}:{batch_id}"
    Effect.objects.create(job_id=context.job_id, fence=context.job.fence, note=note)
    return which


# ---------------------------------------------------------------------------
# Pub/sub and stream subscribers: a delivery calls the function with the message.


@job
def on_message(message: dict[str, Any]) -> dict[str, Any]:
    """Return the message received, so a test can read it from the job's output."""
    return message


# ---------------------------------------------------------------------------
# Jobs that raise a BaseException that is not a shutdown signal: each must end
# its own attempt like any error and leave the worker working.


class JobHalt(BaseException):
    """A custom BaseException a job raises (as some libraries do)."""


def _base_exception(which: str) -> BaseException:
    """Return the BaseException named ``which``."""
    if which == "KeyboardInterrupt":
        return KeyboardInterrupt("raised by the job")
    if which == "GeneratorExit":
        return GeneratorExit("raised by the job")
    if which == "SystemExit":
        return SystemExit("raised by the job")
    return JobHalt("raised by the job")


@job(max_attempts=1)
def rt_raise_base(which: str) -> None:
    """Raise the BaseException named ``which`` (discarded at once)."""
    raise _base_exception(which)


@job(max_attempts=1)
async def rt_async_raise_base(which: str, in_child_task: bool = False) -> None:
    """Raise the BaseException named ``which``, in this task or in a child task it awaits."""
    import asyncio

    async def child() -> None:
        raise _base_exception(which)

    if in_child_task:
        await asyncio.gather(child())
    raise _base_exception(which)


@job(max_attempts=2)
def rt_raise_base_twice(which: str) -> None:
    """Raise the BaseException named ``which`` on every attempt (retried once, then discarded)."""
    raise _base_exception(which)


@job(max_attempts=2)
async def rt_async_raise_base_twice(which: str) -> None:
    """The ``async def`` twin of :func:`rt_raise_base_twice`."""
    raise _base_exception(which)


@job
def obs_enqueue_child(a: int, b: int) -> str:
    """Enqueue ``add(a, b)`` from inside a job; return the child's ID."""
    return str(add.enqueue(a, b).id)


@job
def obs_trace_and_child(a: int, b: int) -> str:
    """Enqueue ``add(a, b)``; return ``{trace ID}-{sampled flag}-{child's ID}`` of this attempt."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    child = add.enqueue(a, b)
    return f"{context.trace_id:032x}-{int(context.trace_flags) & 1}-{child.id}"


def _current_span_id() -> str:
    from opentelemetry import trace

    return format(trace.get_current_span().get_span_context().span_id, "016x")


@job
def obs_current_span() -> str:
    """Return the ID of the OpenTelemetry span current while the job runs."""
    return _current_span_id()


@job
async def obs_current_span_async() -> str:
    """The ``async def`` twin of :func:`obs_current_span`."""
    return _current_span_id()


@job(takes_context=True)
def rt_progress_keep_step(context: Any, n: int = 3) -> dict[str, Any]:
    """Record a step, then move only its cursor (keep_step, never waiting for the row)."""
    context.record_progress("load", {"i": 0})
    for i in range(1, n + 1):
        context.record_progress(cursor={"i": i}, keep_step=True, no_wait=True)
    return {"step": context.progress.step, "cursor": context.progress.cursor}


#: Opened by a test to let rt_gate finish (in-process workers only).
GATE = threading.Event()


@job(takes_context=True, max_attempts=1)
def rt_gate(context: Any, name: str) -> dict[str, Any]:
    """Record that it started, wait for GATE, then write progress, a log line and an
    output that all carry ``name`` (what an erasure must keep out)."""
    _effect(context, "started")
    GATE.wait(10)
    context.log(f"greeted {name}")
    context.record_progress("greeted", {"name": name})
    return {"greeted": name}


@job(takes_context=True, max_attempts=3)
def rt_complete_in_transaction(
    context: Any, roll_back: bool = False, raise_after: bool = False
) -> str:
    """Write an effect and complete the job in one transaction (JobContext.complete)."""
    from django.db import transaction

    from tests.testapp.models import Effect

    context.log("before the transaction")
    try:
        with transaction.atomic():
            Effect.objects.create(job_id=context.job_id, fence=context.job.fence, note="in-tx")
            context.complete({"done": context.attempt})
            if roll_back and context.attempt == 1:
                raise RuntimeError("roll back the first attempt")
    finally:
        context.log("after the transaction")
    if raise_after:
        raise RuntimeError("raised after the completion committed")
    return "the return value is ignored once the job completed itself"


#: Set by a test to let ``rt_hold_own_row`` end its transaction.
HOLD_OWN_ROW = threading.Event()
#: Set by ``rt_hold_own_row`` once its transaction holds its own row.
OWN_ROW_HELD = threading.Event()


@job(takes_context=True, timeout=0.3)
def rt_hold_own_row(context: Any) -> str:
    """Record progress inside a transaction (which then holds the job's row) and stay
    there past the timeout until the test sets HOLD_OWN_ROW."""
    from django.db import transaction

    with transaction.atomic():
        context.record_progress("held", 1)
        OWN_ROW_HELD.set()
        HOLD_OWN_ROW.wait(30)
    return "late"
