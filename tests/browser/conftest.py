"""Browser tests: the admin driven in Debian's headless Chromium through Playwright.

Chromium comes from the system (``apt-get install chromium``; ``make test``
installs it when missing), never from a download at run time: Playwright
launches ``/usr/bin/chromium`` by its path. The sync Playwright API runs an
event loop in the test's thread, so Django's ORM calls in the test body need
``DJANGO_ALLOW_ASYNC_UNSAFE``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Where screenshots go when HOPPER_SCREENSHOTS=1 (docs/admin.md shows them).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"
PASSWORD = "pw-for-browser-tests"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module; Playwright's event loop stops with it, so the
    rest of the suite's async tests run without a loop left in the main thread."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium; make test does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, live_server: Any, transactional_db: None) -> Iterator[Any]:
    """A fresh browser tab at 1280 x 900, the width an operator's laptop gives the admin."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=live_server.url)
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


def login(page: Any, username: str) -> None:
    """Log in through the admin's login form."""
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")


@pytest.fixture
def superuser(django_user_model: Any, transactional_db: None) -> Any:
    return django_user_model.objects.create_superuser("boss", "boss@example.com", PASSWORD)


@pytest.fixture
def viewer(django_user_model: Any, transactional_db: None) -> Any:
    """A staff user who may view hopper's pages and do nothing."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    codenames = ["view_job", "view_jobhistory", "view_queue", "view_batch"]
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def shot(page: Any, name: str) -> None:
    """Save a screenshot of the page for the docs when HOPPER_SCREENSHOTS=1."""
    if os.environ.get("HOPPER_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
