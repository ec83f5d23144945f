"""Redis connections of the registry: shoal_common.connections with ``DISCOVERY["REDIS_ALIAS"]``.

One server or a Redis Cluster: the per-node helpers are shoal_common.redisconn's.
"""
from discovery_app.conf import setting
from shoal_common import connections
from shoal_common.connections import TRANSIENT_ERRORS  # noqa: F401  (re-exported: the app's modules import it here)
from shoal_common.redisconn import is_cluster, node_client, per_slot, recover, slot_pipeline  # noqa: F401  (re-exported)


def get_connection():
    return connections.get_connection(setting("REDIS_ALIAS"))


def dedicated_connection(client_name=None):
    """A client with a pool of its own, made inside the thread that uses it (see shoal_common.connections)."""
    return connections.dedicated_connection(setting("REDIS_ALIAS"), client_name)
