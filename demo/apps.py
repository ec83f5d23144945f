from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo"

    def ready(self):
        from shoal_common.broadcasting import add_loggers

        add_loggers("demo")  # `manage.py broadcast log_level ...` reaches the demo's handlers' logger too
