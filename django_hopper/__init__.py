"""django_hopper: a durable, transactional job queue on the database you already run.

The public API is imported lazily so that importing ``django_hopper`` (as
``INSTALLED_APPS`` does) touches neither models nor settings.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0.dev0"

_LAZY = {
    # populated as the api modules land; name -> module
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_hopper' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)
