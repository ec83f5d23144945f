"""Discovery's Redis clients: the server and options of django-redis's, with a short timeout.

The shared pool's socket timeout (5 s) suits the consumers, not a request path. Discovery never
blocks on Redis on purpose, and a hung Redis must cost a resolve() about REDIS_TIMEOUT (1 s), after
which the client serves what it has cached. One client per django-redis pool and timeout, kept
while that pool lives; redis-py pools start afresh in a forked child (they check the pid).
When REDIS_URL points at a Redis Cluster they are cluster clients (shoal_common.redisconn's
dedicated_connection), kept per shared cluster client (one per process).
"""
import threading
import weakref

import redis

from discovery_app.conf import setting
from discovery_app.connection import get_connection, is_cluster
from shoal_common.redisconn import dedicated_connection

_clients = weakref.WeakKeyDictionary()  # django-redis pool -> {timeout: redis.Redis}
_lock = threading.Lock()


def _kwargs(pool, timeout):
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = timeout
    kwargs["socket_connect_timeout"] = min(timeout, kwargs.get("socket_connect_timeout") or timeout)
    return kwargs


def _cluster_client(shared, timeout):
    connect_timeout = shared.get_connection_kwargs().get("socket_connect_timeout") or timeout
    return dedicated_connection(shared, socket_timeout=timeout, socket_connect_timeout=min(timeout, connect_timeout))


def registry_connection():
    """The shared short-timeout client for registry reads and writes in this process."""
    shared = get_connection()
    timeout = setting("REDIS_TIMEOUT")
    if is_cluster(shared):
        owner, make = shared, lambda: _cluster_client(shared, timeout)
    else:
        pool = shared.connection_pool
        owner = pool

        def make():
            return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class,
                                                          **_kwargs(pool, timeout)))
    with _lock:
        by_timeout = _clients.setdefault(owner, {})
        client = by_timeout.get(timeout)
        if client is None:
            client = by_timeout[timeout] = make()
        return client


def dedicated_registry_connection():
    """A short-timeout client with a pool of its own, for a thread that must not share one (made
    inside that thread, so nothing created in a pre-fork master is shared)."""
    shared = get_connection()
    if is_cluster(shared):
        return _cluster_client(shared, setting("REDIS_TIMEOUT"))
    pool = shared.connection_pool
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class,
                                                  **_kwargs(pool, setting("REDIS_TIMEOUT"))))
