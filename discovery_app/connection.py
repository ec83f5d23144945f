"""Redis connections for the registry: from django-redis, never kept in a module global.

redis-py pools remember the pid that made them and start afresh in a forked child, so a gunicorn
worker never writes to a socket its master also uses.
"""
import redis
from django_redis import get_redis_connection

from discovery_app.conf import setting

# "Redis is not reachable right now": retry with back-off, serve stale, but never crash for it.
TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def get_connection():
    return get_redis_connection(setting("REDIS_ALIAS"))


def dedicated_connection(client_name=None):
    """A client with a pool of its own (same server and options as django-redis's).

    Made inside the thread that uses it, so nothing created in a pre-fork master is shared.
    """
    pool = get_connection().connection_pool
    kwargs = dict(pool.connection_kwargs)
    if client_name:
        kwargs["client_name"] = client_name
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs))
