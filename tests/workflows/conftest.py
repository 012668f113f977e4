"""Fixtures of the process-level workflow tests: the runtime suite's worker processes."""

from tests.support.runtime import Processes, make_worker, processes  # noqa: F401

__all__ = ["Processes"]
