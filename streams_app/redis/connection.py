"""Redis connections of streams_app: shoal_common.connections with ``STREAMS["REDIS_ALIAS"]``.

One server or a Redis Cluster: the per-node helpers are shoal_common.redisconn's.
"""
from shoal_common import connections
from shoal_common.connections import TRANSIENT_ERRORS  # noqa: F401  (re-exported: the apps' modules import it here)
from shoal_common.redisconn import (  # noqa: F401  (re-exported)
    is_cluster, node_client, per_slot, probing_within, recover, slot_pipeline,
)
from shoal_common.page_redis import OneAttempt, short_timeout_client
from streams_app.conf import setting


def get_connection():
    return connections.get_connection(setting("REDIS_ALIAS"))


# Seconds a blocking read's reply may take beyond its BLOCK: the reader's own socket timeout, so that
# a read on a dead connection fails soon after its block ends, not after the pool's SOCKET_TIMEOUT.
BLOCKING_READ_MARGIN = 5.0


def dedicated_connection(client_name, **overrides):
    """A client with a pool of its own whose connections carry ``client_name`` (see shoal_common.connections)."""
    return connections.dedicated_connection(setting("REDIS_ALIAS"), client_name, **overrides)


def reader_connection(client_name, block_ms):
    """A dedicated client for blocking reads of at most ``block_ms``: its socket timeout is the block
    plus BLOCKING_READ_MARGIN, whatever the shared pool's SOCKET_TIMEOUT."""
    return dedicated_connection(client_name, socket_timeout=block_ms / 1000 + BLOCKING_READ_MARGIN)


def web_connection():
    """The shared client with the admin's short timeout (``STREAMS["ADMIN_REDIS_TIMEOUT"]``), no retry.

    Made for the first time in a process (a gunicorn worker started during an outage), the shared
    client asks Redis whether it is a cluster: within that timeout too, once.
    """
    timeout = setting("ADMIN_REDIS_TIMEOUT")
    with probing_within(timeout):
        shared = get_connection()
    return short_timeout_client(shared, timeout)


def page_connection(request):
    """The web client for one request, which asks a hung Redis once (shoal_common.page_redis.OneAttempt)."""
    conn = getattr(request, "_shoal_redis", None)
    if conn is None:
        try:
            conn = OneAttempt(web_connection())
        except TRANSIENT_ERRORS as exc:  # the first connection's probe: the page shows the last copy
            conn = OneAttempt.failed(exc)
        request._shoal_redis = conn
    return conn
