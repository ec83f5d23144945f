from django.apps import AppConfig


class TracingAppConfig(AppConfig):
    name = "tests.tracingapp"
    label = "tracingapp"
