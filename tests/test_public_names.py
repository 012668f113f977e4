"""The public names of ``django_hopper``: each is its object, whatever was imported first.

A lazy export whose name is also a submodule's is shadowed by the submodule as
soon as anything imports it (Python sets the package attribute), so
``from django_hopper import X`` would return a module. No public name may be a
submodule's name, and each resolves to its object even after every module of
the package has been imported.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import django_hopper

ROOT = Path(__file__).resolve().parent.parent


def submodule_names() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(django_hopper.__path__)}


def test_public_names__none_is_also_a_submodule_name() -> None:
    assert set(django_hopper._LAZY) & submodule_names() == set()


def test_public_names__resolve_to_their_objects_after_every_module_is_imported() -> None:
    for info in pkgutil.walk_packages(django_hopper.__path__, "django_hopper."):
        if ".migrations." in info.name or info.name.endswith(".migrations"):
            continue
        importlib.import_module(info.name)

    for name, module in django_hopper._LAZY.items():
        assert getattr(django_hopper, name) is getattr(importlib.import_module(module), name), name
    assert set(django_hopper.__all__) == {*django_hopper._LAZY, "__version__"}


#: The operator functions a project calls from its own code, each reachable as
#: ``from django_hopper import NAME`` (not only from its module).
OPERATOR_FUNCTIONS = {
    "django_hopper.api": ["erase_subject", "subject_erasures"],
    "django_hopper.runs": ["list_runs"],
    "django_hopper.pubsub": ["pause_subscription", "resume_subscription", "unsubscribe"],
    "django_hopper.streams": [
        "pause_consumer",
        "resume_consumer",
        "reset_consumer",
        "delete_consumer",
        "consumer_lag",
    ],
    "django_hopper.periodic": [
        "run_periodic_now",
        "disable_periodic",
        "enable_periodic",
        "periodic_states",
    ],
}


def test_public_names__operator_functions_are_exported_at_the_top_level() -> None:
    for module, names in OPERATOR_FUNCTIONS.items():
        for name in names:
            assert name in django_hopper.__all__, name
            assert getattr(django_hopper, name) is getattr(importlib.import_module(module), name)


def test_resumable__the_documented_import_decorates_in_a_fresh_interpreter() -> None:
    """``from django_hopper import resumable`` after the module that defines it was
    imported (as a worker or the app registry would) still gives the decorator."""
    code = (
        "import django; django.setup()\n"
        "import django_hopper.runs\n"
        "from django_hopper import resumable\n"
        "decorate = resumable(queue='imports')\n"
        "print(resumable is django_hopper.runs.resumable, callable(decorate))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True True"
