"""Redis connections of the registry: shoal_common.connections with ``DISCOVERY["REDIS_ALIAS"]``."""
from discovery_app.conf import setting
from shoal_common import connections
from shoal_common.connections import TRANSIENT_ERRORS  # noqa: F401  (re-exported: the app's modules import it here)


def get_connection():
    return connections.get_connection(setting("REDIS_ALIAS"))


def dedicated_connection(client_name=None):
    """A client with a pool of its own, made inside the thread that uses it (see shoal_common.connections)."""
    return connections.dedicated_connection(setting("REDIS_ALIAS"), client_name)
