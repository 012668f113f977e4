"""The process-level controls tests reuse the runtime suite's worker processes."""

from tests.support.runtime import processes  # noqa: F401
