"""Fixtures of the resumable tests: worker processes and in-process workers come
from the runtime suite."""

from tests.support.runtime import make_worker, processes  # noqa: F401
