"""The hook through which a worker syncs what the API layer declares, without importing it.

:data:`SETUP_DECLARATIONS` holds callables a worker calls with its engine at
setup, once the job modules were imported, to upsert what the code declares.
``AppConfig.ready`` registers the subscriptions and stream consumers
(:func:`django_hopper.streams.sync_declared`). This module imports nothing, so
registering costs a process nothing at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine

#: Called in order with the engine by ``Worker.setup``.
SETUP_DECLARATIONS: list[Callable[[BaseEngine], object]] = []
