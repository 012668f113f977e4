"""The process-level controls tests reuse the runtime suite's worker processes."""

from tests.runtime.conftest import processes  # noqa: F401
