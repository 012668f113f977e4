#!/usr/bin/env python
"""The example project's command line (``python manage.py hopper_demo``)."""

import os
import sys
from pathlib import Path


def main() -> None:
    """Run a management command of the example project."""
    # Let the example run from a clean clone without installing django_hopper.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
