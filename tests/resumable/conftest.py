"""Fixtures of the resumable tests: worker processes come from the runtime suite."""

from tests.support.runtime import processes  # noqa: F401
