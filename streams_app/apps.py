from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class StreamsConfig(AppConfig):
    name = "streams_app"
    verbose_name = "Streams"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from shoal_common.broadcasting import add_loggers
        from streams_app import broadcast, checks  # noqa: F401  (registers the system checks and the built-in broadcasts)

        add_loggers("streams_app")

        # Like admin.py: every installed app's consumers.py declares its @consumer handlers.
        autodiscover_modules("consumers")
