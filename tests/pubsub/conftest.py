"""Fixtures of the pub/sub and streams API tests: the runtime suite's workers,
in-process and real processes."""

from tests.support.runtime import make_worker, processes  # noqa: F401
