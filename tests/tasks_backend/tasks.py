"""Tasks for the backend tests, declared with the Tasks API's own ``@task``.

They are decorated under the test ``TASKS`` setting, so that they are made by
HopperBackend's task class, as in a project whose settings name hopper. The
first group mirrors Django's ``tests/tasks/tasks.py`` (same names, same bodies).
"""

from __future__ import annotations

import time
from typing import Any

from django.test import override_settings

from django_hopper.tasks_compat import TaskContext, task
from tests.tasks_backend.settings import TASKS

#: Calls made by tasks that record them (tests read and clear it).
CALLS: list[Any] = []

with override_settings(TASKS=TASKS):

    @task()
    def noop_task(*args: Any, **kwargs: Any) -> None:
        return None

    @task
    def noop_task_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
        return None

    @task()
    async def noop_task_async(*args: Any, **kwargs: Any) -> None:
        return None

    @task()
    def calculate_meaning_of_life() -> int:
        return 42

    @task()
    def failing_task_value_error() -> None:
        raise ValueError("This Task failed due to ValueError")

    @task()
    def failing_task_system_exit() -> None:
        raise SystemExit("This Task failed due to SystemExit")

    @task()
    def complex_exception() -> None:
        raise ValueError(ValueError("This task failed"))

    @task()
    def complex_return_value() -> Any:
        # Return something which isn't JSON serializable nor picklable.
        return lambda: True

    @task(takes_context=True)
    def get_task_id(context: TaskContext) -> str:
        return str(context.task_result.id)

    @task(takes_context=True)
    def test_context(context: TaskContext, attempt: int) -> None:
        assert isinstance(context, TaskContext)
        assert context.attempt == attempt

    # -- hopper's own cases --------------------------------------------------

    @task()
    def add(a: int, b: int) -> int:
        CALLS.append(("add", a, b))
        return a + b

    @task()
    async def add_async(a: int, b: int) -> int:
        CALLS.append(("add_async", a, b))
        return a + b

    @task(takes_context=True)
    def describe_context(context: TaskContext) -> dict[str, Any]:
        from django_hopper.tasks import job_context

        result = context.task_result
        return {
            "id": result.id,
            "attempt": context.attempt,
            "status": str(result.status),
            "backend": result.backend,
            "hopper_job_id": str(job_context().job_id),
        }

    @task(backend="retrying")
    def flaky(failures: int) -> str:
        from django_hopper.tasks import job_context

        attempt = job_context().attempt
        if attempt <= failures:
            raise RuntimeError(f"failure {attempt}")
        return f"succeeded on attempt {attempt}"

    @task(queue_name="emails", priority=7, tags=("mail",), unique_key="digest")
    def send_digest() -> None:
        CALLS.append(("send_digest",))

    @task()
    def sleep_for(seconds: float) -> None:
        time.sleep(seconds)

    @task()
    def failing_task_exception_group() -> None:
        raise ExceptionGroup("two things failed", [ValueError("one"), KeyError("two")])

    @task()
    async def failing_task_async() -> None:
        raise ValueError("This async Task failed")

    @task()
    def returns_nul() -> str:
        return "a\x00b"


def not_a_task() -> None:
    """A plain function at module level (for validation tests)."""
