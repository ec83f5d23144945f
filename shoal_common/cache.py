"""The django-redis cache entry Shoal's apps need, for a host project's settings.

    from shoal_common.cache import redis_cache
    CACHES = {"default": redis_cache(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))}

Imports nothing: settings modules load it before Django is set up.
"""


def redis_cache(url, **options):
    """A CACHES entry for ``url`` (``redis://``, ``rediss://`` or ``redis+cluster://``); ``options`` are
    merged into its OPTIONS (e.g. ``SOCKET_TIMEOUT=60``)."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
        "OPTIONS": {
            # One server or a Redis Cluster (detected, or forced by redis+cluster://): shoal_common.redisconn.
            "CONNECTION_FACTORY": "shoal_common.redisconn.ConnectionFactory",
            "SOCKET_CONNECT_TIMEOUT": 5,
            # Must outlast the longest blocking read (STREAMS["BLOCK_MS"]); system check streams_app.W001 says so.
            "SOCKET_TIMEOUT": 30,
            "CONNECTION_POOL_KWARGS": {"health_check_interval": 30},
            **options,
        },
    }
