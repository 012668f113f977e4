"""The example project's demo stays in the example project: a project that installs
django_hopper gets no command that imports the example app."""

from __future__ import annotations

import re
from pathlib import Path

from django.core.management import get_commands

import django_hopper

LIBRARY = Path(django_hopper.__file__).resolve().parent
ROOT = LIBRARY.parent


def test_library__ships_no_demo_command() -> None:
    assert "hopper_demo" not in get_commands()
    assert not (LIBRARY / "management" / "commands" / "hopper_demo.py").exists()


def test_library__never_imports_the_example_app() -> None:
    importing = re.compile(r"^\s*(from|import)\s+shop\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in LIBRARY.rglob("*.py")
        if importing.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_example_project__has_the_demo_command() -> None:
    command = ROOT / "example_project" / "shop" / "management" / "commands" / "hopper_demo.py"
    assert "class Command(BaseCommand)" in command.read_text(encoding="utf-8")
