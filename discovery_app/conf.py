"""``settings.DISCOVERY`` merged over ``discovery_app.defaults``, read lazily and re-read when tests change it."""
from functools import lru_cache

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from discovery_app.defaults import DEFAULTS


@lru_cache(maxsize=None)
def get_settings():
    user = getattr(settings, "DISCOVERY", None) or {}
    if not isinstance(user, dict):
        # checks.py reports this as discovery_app.E001; fall back so the check can run at all.
        user = {}
    return {**DEFAULTS, **user}


def setting(name):
    return get_settings()[name]


@receiver(setting_changed)
def _reset(*, setting, **kwargs):
    if setting == "DISCOVERY":
        get_settings.cache_clear()
