"""Runtime tests: the shared helpers live in tests/support/runtime.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.runtime import make_worker, processes  # noqa: F401  (fixtures)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this directory's ``slow`` soak runs unless ``-m`` names them."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="soak run: select with -m slow")
    here = str(Path(__file__).parent)
    for item in items:
        if "slow" in item.keywords and str(item.path).startswith(here):
            item.add_marker(skip)
