"""Fixtures of the observability tests: worker processes from the runtime tests."""

from tests.runtime.conftest import make_worker, processes  # noqa: F401
