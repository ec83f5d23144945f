"""Service registry with TTL heartbeats and a load-balancing discovery client (see issue 6)."""
from django.apps import AppConfig


class DiscoveryConfig(AppConfig):
    name = "discovery_app"
    verbose_name = "Service discovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from discovery_app import checks  # noqa: F401  (registers the system checks)
        from discovery_app.sync import sync_instances
        from shoal_common.broadcasting import add_loggers, on_broadcast
        from shoal_common.mirrors import register_mirror

        add_loggers("discovery_app")
        # `manage.py broadcast discovery.invalidate '{"service": "billing"}'`: every client of every
        # listening process drops its cache of that service (all services without one).
        on_broadcast("discovery.invalidate")(invalidate_from_broadcast)
        # The control room's instances page is a mirror refreshed with the streams mirror.
        register_mirror(sync_instances)


def invalidate_from_broadcast(data):
    from discovery_app.hub import invalidate

    invalidate((data or {}).get("service"))
