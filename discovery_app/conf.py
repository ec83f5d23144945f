"""``settings.DISCOVERY`` merged over ``discovery_app.defaults``, read lazily and re-read when tests change it."""
from discovery_app.defaults import DEFAULTS
from shoal_common.appsettings import namespaced_settings

get_settings = namespaced_settings("DISCOVERY", DEFAULTS)


def setting(name):
    return get_settings()[name]
