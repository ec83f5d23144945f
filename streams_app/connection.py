"""Redis connections, always obtained from django-redis and never kept in a module global.

redis-py pools remember the pid that made them and start afresh in a forked child, so a worker
process never writes to a socket its parent also uses.
"""
import redis
from django_redis import get_redis_connection

from streams_app.conf import setting

# Errors that mean "Redis is not reachable right now": retry with back-off rather than crash.
TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def get_connection():
    return get_redis_connection(setting("REDIS_ALIAS"))


def dedicated_connection(client_name):
    """A client with a pool of its own whose connections carry ``client_name``.

    Blocking readers use one, so that shutdown can find their connection in CLIENT LIST and
    CLIENT UNBLOCK it instead of waiting for BLOCK to run out.
    """
    shared = get_connection()
    pool = shared.connection_pool
    kwargs = dict(pool.connection_kwargs, client_name=client_name)
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs))
