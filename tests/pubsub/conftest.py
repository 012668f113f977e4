"""Fixtures of the pub/sub and streams API tests: the runtime suite's in-process workers."""

from tests.runtime.conftest import make_worker  # noqa: F401
