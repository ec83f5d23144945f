"""``settings.STREAMS`` merged over ``streams_app.defaults``, read lazily and re-read when tests change it."""
from functools import lru_cache

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from streams_app.defaults import DEFAULTS


@lru_cache(maxsize=None)
def get_settings():
    user = getattr(settings, "STREAMS", None) or {}
    if not isinstance(user, dict):
        # checks.py reports this as streams_app.E001; fall back so the check can run at all.
        user = {}
    return {**DEFAULTS, **user}


def setting(name):
    return get_settings()[name]


@receiver(setting_changed)
def _reset(*, setting, **kwargs):
    if setting == "STREAMS":
        get_settings.cache_clear()
