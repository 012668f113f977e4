"""Which function runs a job: the registry of ``@job`` functions and :func:`resolve`.

A job's *kind* is its function's import path (or the ``kind=`` it was given),
so a worker finds the function by importing it. Decorating registers the
function under its kind; :func:`resolve` answers from the registry, else
imports the kind's module and asks the registered *resolvers* what the
attribute at that path runs as: :mod:`django_hopper.jobs` registers the one
for ``@job`` functions, and the Django Tasks backend (from the app's
``ready``) the one for ``@task`` functions. The runtime depends on this module
only, never on the modules that register resolvers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING, Any

from django_hopper.exceptions import InvalidJob, UnknownJobKind

if TYPE_CHECKING:
    from django_hopper.jobs import JobFunction

#: Every ``@job`` function, by kind. Filled at decoration (importing a module
#: registers its jobs); read by :func:`resolve`.
registry: dict[str, JobFunction[Any, Any]] = {}
_registry_lock = threading.Lock()

#: Turns the object found at a kind's import path into the job function that
#: runs it, or returns None when the object is not of its sort.
Resolver = Callable[[object], "JobFunction[Any, Any] | None"]

#: The resolvers :func:`resolve` asks, in order (see :func:`register_resolver`).
resolvers: list[Resolver] = []


def register_resolver(resolver: Resolver) -> None:
    """Add a resolver that :func:`resolve` asks for objects found at import paths.

    Registering the same resolver again does nothing, so an app's ``ready``
    may run twice (tests, ``django.setup()`` called again).
    """
    with _registry_lock:
        if resolver not in resolvers:
            resolvers.append(resolver)


def kind_of(func: Callable[..., Any]) -> str:
    """Return the kind a function gets by default: its import path."""
    return f"{func.__module__}.{func.__qualname__}"


def register(jf: JobFunction[Any, Any]) -> None:
    """Record a job under its kind; refuse a second function claiming the same kind.

    The same function decorated again (a module imported twice, or
    reloaded) replaces its earlier registration.
    """
    with _registry_lock:
        existing = registry.get(jf.kind)
        if existing is not None and kind_of(existing.func) != kind_of(jf.func):
            raise InvalidJob(
                f"kind {jf.kind!r} is already registered for {kind_of(existing.func)}; "
                "give one of them another kind",
                field="kind",
            )
        registry[jf.kind] = jf


#: Kinds whose attempts are passes of resumable runs (``@resumable``). The
#: runtime reads it to take their expired pass leases over at its next claim and
#: to count a claim of theirs that never began as an admission miss.
resumable_kinds: set[str] = set()


def register_resumable(kind: str) -> None:
    """Record that ``kind``'s attempts are passes of resumable runs."""
    with _registry_lock:
        resumable_kinds.add(kind)


def resumable() -> tuple[str, ...]:
    """Return the registered resumable kinds, sorted (empty: nothing to take over)."""
    with _registry_lock:
        return tuple(sorted(resumable_kinds))


#: How the error of a kind that leads to no job function starts (workers store it).
UNKNOWN_KIND_PREFIX = "unknown job kind"


def resolve(kind: str) -> JobFunction[Any, Any]:
    """Return the ``@job`` function of a kind, importing its module if needed.

    The registry answers first; otherwise the longest importable module prefix
    of the kind is imported (which registers its jobs) and the rest is looked
    up as attributes. Raises UnknownJobKind naming the kind if it does not
    lead to a ``@job`` function. An error raised while importing the job's
    module itself propagates, so a broken module is not reported as unknown.
    """
    found = registry.get(kind)
    if found is not None:
        return found
    if not isinstance(kind, str) or not kind:
        raise UnknownJobKind(f"job kind must be a non-empty string, not {kind!r}", field="kind")
    parts = kind.split(".")
    problem = f"no module of {kind!r} can be imported"
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            module = import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if module_name == missing or module_name.startswith(missing + "."):
                continue  # this prefix is not a module: try a shorter one
            raise
        found = registry.get(kind)
        if found is not None:
            return found
        obj: Any = module
        for depth, attr in enumerate(parts[i:], start=i):
            obj = getattr(obj, attr, None)
            if obj is None:
                problem = f"{'.'.join(parts[:depth])!r} has no attribute {attr!r}"
                break
        for resolver in resolvers:
            fn = resolver(obj)
            if fn is not None:
                return fn
        if obj is not None:
            problem = f"{kind!r} is a {type(obj).__name__}, not a @job function"
        break
    raise UnknownJobKind(
        f"{UNKNOWN_KIND_PREFIX} {kind!r}: no @job function is registered under it or found at "
        f"that import path ({problem}; is its module listed in HOPPER['IMPORTS']?)",
        field="kind",
    )
