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
            # Every reply but a blocking read's (a consumer's reader gets BLOCK_MS + 5 s of its own): after a
            # network fault heals, a process works again within this plus RECONNECT_BACKOFF_MAX
            # (docs/consuming.md "Network faults"). Redis itself calls a script busy after 5 s.
            "SOCKET_TIMEOUT": 5,
            "CONNECTION_POOL_KWARGS": {"health_check_interval": 30},
            **options,
        },
    }
