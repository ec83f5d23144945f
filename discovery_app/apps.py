"""Service registry with TTL heartbeats and a load-balancing discovery client (see issue 6)."""
from django.apps import AppConfig


class DiscoveryConfig(AppConfig):
    name = "discovery_app"
    verbose_name = "Service discovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from discovery_app import checks  # noqa: F401  (registers the system checks)
