"""tests.settings with a router that keeps hopper out of "default".

For the migration test of an alias hopper does not use: ``migrate`` there
runs hopper's migrations, and every operation must leave the alias alone.
"""

from tests.settings import *  # noqa: F403


class NoHopperRouter:
    """Hopper's tables live elsewhere: none on "default"."""

    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool | None:
        if app_label == "django_hopper":
            return db != "default"
        return None


DATABASE_ROUTERS = ["tests.topology.routed_settings.NoHopperRouter"]
