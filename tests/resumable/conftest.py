"""Fixtures of the resumable tests: worker processes come from the runtime suite."""

from tests.runtime.conftest import processes  # noqa: F401
