"""Settings for hopper's own test suite.

``HOPPER_TEST_DATABASE`` picks the engine: ``sqlite`` (default) or
``postgres``. PostgreSQL is reached through the ``PG*`` variables (``PGHOST``,
``PGPORT``, ``PGUSER``, ``PGPASSWORD``), which ``scripts/testdb`` sets when it
starts a throwaway server. Worker processes started by tests get
``HOPPER_TEST_DB_NAME``, the name of the test database pytest-django created,
so they work on the same data.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "hopper-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS and JS, served by live_server (browser tests)
    "django_hopper",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

ENGINE = os.environ.get("HOPPER_TEST_DATABASE", "sqlite")
_db_name = os.environ.get("HOPPER_TEST_DB_NAME")
_suffix = os.environ.get("HOPPER_TEST_DB_SUFFIX", "main")
_SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}

#: A PgBouncer in front of the server (tests/pgbouncer.py; scripts/test's bouncer pass):
#: its port and pool mode. "default" then goes through it, and "direct" is the
#: same database without it, for LISTEN and maintenance.
_bouncer_port = os.environ.get("HOPPER_TEST_PGBOUNCER_PORT")
_bouncer_mode = os.environ.get("HOPPER_TEST_PGBOUNCER_MODE", "transaction")

if ENGINE == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _db_name or os.environ.get("PGDATABASE", "hopper"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "root"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "TEST": {"NAME": f"test_hopper_{_suffix}"},
        }
    }
    # Several databases (tests/topology/test_databases.py): a second PostgreSQL
    # database and an SQLite file beside it, set up only for the tests that ask.
    DATABASES["second"] = {
        **DATABASES["default"],
        "NAME": os.environ.get("HOPPER_TEST_SECOND_DB_NAME", "hopper_second"),
        "TEST": {"NAME": f"test_hopper_{_suffix}_second"},
    }
    DATABASES["embedded"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("HOPPER_TEST_EMBEDDED_DB_NAME")
        or str(BASE_DIR / f".test-{_suffix}-embedded.sqlite3"),
        "OPTIONS": _SQLITE_OPTIONS,
        "TEST": {"NAME": str(BASE_DIR / f".test-{_suffix}-embedded.sqlite3")},
    }
    if _bouncer_port:
        DATABASES["direct"] = dict(DATABASES["default"])
        DATABASES["default"] = {
            **DATABASES["default"],
            "PORT": _bouncer_port,
            # Django's advice for transaction pooling: no server-side cursors.
            "DISABLE_SERVER_SIDE_CURSORS": _bouncer_mode == "transaction",
        }
elif ENGINE == "sqlite":
    _file = str(BASE_DIR / f".test-{_suffix}.sqlite3")
    _second = str(BASE_DIR / f".test-{_suffix}-second.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _db_name or _file,
            "OPTIONS": _SQLITE_OPTIONS,
            # A file, not :memory:, so that worker processes share it.
            "TEST": {"NAME": _file},
        },
        "second": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("HOPPER_TEST_SECOND_DB_NAME") or _second,
            "OPTIONS": _SQLITE_OPTIONS,
            "TEST": {"NAME": _second},
        },
    }
else:
    raise RuntimeError(f"HOPPER_TEST_DATABASE must be sqlite or postgres, not {ENGINE!r}")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
HOPPER = {
    "QUEUES": {"default": 10},
    "POLL_INTERVAL": 0.2,
    "IMPORTS": ["tests.testapp.jobs"],
}
if ENGINE == "postgres" and _bouncer_port:
    HOPPER["POOLERS"] = {"default": _bouncer_mode}
    HOPPER["DIRECT_DATABASES"] = {"default": "direct"}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # HOPPER_TEST_LOG_LEVEL: worker processes whose test reads their INFO lines.
    "loggers": {
        "django_hopper": {
            "handlers": ["console"],
            "level": os.environ.get("HOPPER_TEST_LOG_LEVEL", "WARNING"),
        }
    },
}
if os.environ.get("HOPPER_TEST_NO_LOGGING"):
    # A project that leaves LOGGING alone: the worker installs its own console.
    LOGGING = {"version": 1, "disable_existing_loggers": False}

# Worker processes started by the runtime tests get short leases and intervals.
HOPPER.update(__import__("json").loads(os.environ.get("HOPPER_TEST_OVERRIDES", "{}")))
