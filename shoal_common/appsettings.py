"""One namespaced settings dict per app (``STREAMS``, ``DISCOVERY``), merged over documented defaults.

Read lazily and cached; the cache is dropped when a test changes the setting (``setting_changed``).
Validation is each app's system checks' job, so a malformed dict falls back to the defaults here.
"""
from functools import cache

from django.conf import settings
from django.core.signals import setting_changed


def namespaced_settings(name, defaults):
    """Return ``get_settings()``: ``settings.<name>`` merged over ``defaults``."""

    @cache
    def get_settings():
        user = getattr(settings, name, None) or {}
        return {**defaults, **(user if isinstance(user, dict) else {})}

    def reset(*, setting, **kwargs):
        if setting == name:
            get_settings.cache_clear()

    setting_changed.connect(reset, weak=False)
    return get_settings
