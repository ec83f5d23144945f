"""Redis connections from django-redis, remembered per thread as Django remembers the cache backend, and
the errors that mean "not now".

redis-py pools remember the pid that made them and start afresh in a forked child, so a worker
process never writes to a socket its parent also uses. Each app passes its own alias setting.
One server or a Redis Cluster behind the same alias: see shoal_common.redisconn.
"""
import threading

from django.core.signals import setting_changed
from django_redis import get_redis_connection

from shoal_common import redisconn
from shoal_common.redisconn import TRANSIENT_ERRORS  # noqa: F401  (re-exported: one tuple for both apps)


_local = threading.local()


def get_connection(alias):
    """django-redis's client for ``alias``, the one Django's per-thread cache backend holds.

    Asking django-redis goes through Django's context-local cache handler: a few µs, as much as
    everything else a ``publish`` does in Python. The client is the same each time within a thread
    (and shares the process's pool with other threads), so each thread keeps it, until CACHES changes.
    """
    clients = getattr(_local, "clients", None)
    if clients is None:
        clients = _local.clients = {}
    client = clients.get(alias)
    if client is None:
        client = clients[alias] = get_redis_connection(alias)
    return client


def _forget_clients(*, setting, **kwargs):
    global _local
    if setting == "CACHES":  # Django drops its cache backends then: every thread asks again
        _local = threading.local()


setting_changed.connect(_forget_clients, weak=False)


def close_all():
    """Close the sockets of every django-redis pool of this process, at its clean exit: a socket left for the
    interpreter's shutdown prints "ResourceWarning: unclosed <socket ...>" under PYTHONWARNINGS=default."""
    from django.conf import settings

    for alias in getattr(settings, "CACHES", {}):
        try:
            client = get_redis_connection(alias)
        except Exception:  # noqa: BLE001 -- a cache that is not django-redis's, or not configured
            continue
        pool = getattr(client, "connection_pool", None)
        try:
            pool.disconnect() if pool is not None else client.close()  # a cluster client has no single pool
        except Exception:  # noqa: BLE001 -- exiting: nothing to do about it
            pass


def dedicated_connection(alias, client_name=None, **overrides):
    """A client with a pool of its own (same server(s) and options as django-redis's).

    Blocking readers use one, so that shutdown can find their connection in CLIENT LIST (by
    ``client_name``) and CLIENT UNBLOCK it; threads make theirs inside the thread, so nothing
    created in a pre-fork master is shared.
    """
    return redisconn.dedicated_connection(get_connection(alias), client_name, **overrides)
