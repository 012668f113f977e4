"""Fixtures of the observability tests: worker processes from the runtime tests."""

from tests.support.runtime import make_worker, processes  # noqa: F401
