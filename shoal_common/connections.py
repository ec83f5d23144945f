"""Redis connections from django-redis, never kept in a module global, and the errors that mean "not now".

redis-py pools remember the pid that made them and start afresh in a forked child, so a worker
process never writes to a socket its parent also uses. Each app passes its own alias setting.
One server or a Redis Cluster behind the same alias: see shoal_common.redisconn.
"""
from django_redis import get_redis_connection

from shoal_common import redisconn
from shoal_common.redisconn import TRANSIENT_ERRORS  # noqa: F401  (re-exported: one tuple for both apps)


def get_connection(alias):
    return get_redis_connection(alias)


def dedicated_connection(alias, client_name=None):
    """A client with a pool of its own (same server(s) and options as django-redis's).

    Blocking readers use one, so that shutdown can find their connection in CLIENT LIST (by
    ``client_name``) and CLIENT UNBLOCK it; threads make theirs inside the thread, so nothing
    created in a pre-fork master is shared.
    """
    return redisconn.dedicated_connection(get_connection(alias), client_name)
