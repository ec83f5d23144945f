"""Redis connections from django-redis, never kept in a module global, and the errors that mean "not now".

redis-py pools remember the pid that made them and start afresh in a forked child, so a worker
process never writes to a socket its parent also uses. Each app passes its own alias setting.
"""
import redis
from django_redis import get_redis_connection

# "Redis is not reachable right now": retry with back-off (or serve what is cached), never crash for it.
TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def get_connection(alias):
    return get_redis_connection(alias)


def dedicated_connection(alias, client_name=None):
    """A client with a pool of its own (same server and options as django-redis's).

    Blocking readers use one, so that shutdown can find their connection in CLIENT LIST (by
    ``client_name``) and CLIENT UNBLOCK it; threads make theirs inside the thread, so nothing
    created in a pre-fork master is shared.
    """
    pool = get_connection(alias).connection_pool
    kwargs = dict(pool.connection_kwargs)
    if client_name:
        kwargs["client_name"] = client_name
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs))
