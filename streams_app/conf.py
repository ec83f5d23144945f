"""``settings.STREAMS`` merged over ``streams_app.defaults``, read lazily and re-read when tests change it."""
from shoal_common.appsettings import namespaced_settings
from streams_app.defaults import DEFAULTS

get_settings = namespaced_settings("STREAMS", DEFAULTS)


def setting(name):
    return get_settings()[name]
