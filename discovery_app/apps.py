from django.apps import AppConfig


class DiscoveryConfig(AppConfig):
    name = "discovery_app"
    verbose_name = "Service discovery"
    default_auto_field = "django.db.models.BigAutoField"
