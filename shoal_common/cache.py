"""The django-redis cache entry Shoal's apps need, for a host project's settings.

    from shoal_common.cache import redis_cache
    CACHES = {"default": redis_cache(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))}

Imports nothing: settings modules load it before Django is set up.
"""


def split_seeds(url):
    """(URL of the first host, [every "host:port"]) for a URL naming several Redis Cluster seed nodes,
    ``redis+cluster://h1:7000,h2:7000,h3:7000/0``; (url, []) for one host.

    django-redis reads commas in LOCATION as a primary and its replicas, so the other seeds go in
    OPTIONS["CLUSTER_SEEDS"] instead (shoal_common.redisconn.ConnectionFactory starts from all of them)."""
    scheme, sep, rest = url.partition("://") if isinstance(url, str) else ("", "", "")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not sep or "," not in hosts:
        return url, []
    seeds = [host.strip() for host in hosts.split(",")]
    return f"{scheme}://{userinfo}{at}{seeds[0]}{slash}{path}", seeds


def redis_cache(url, **options):
    """A CACHES entry for ``url`` (``redis://``, ``rediss://`` or ``redis+cluster://``; a cluster's may
    name several seed nodes, comma-separated); ``options`` are merged into its OPTIONS (e.g.
    ``SOCKET_TIMEOUT=60``)."""
    location, seeds = split_seeds(url)
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": location,
        "OPTIONS": {
            # One server or a Redis Cluster (detected, or forced by redis+cluster://): shoal_common.redisconn.
            "CONNECTION_FACTORY": "shoal_common.redisconn.ConnectionFactory",
            "SOCKET_CONNECT_TIMEOUT": 5,
            # Every reply but a blocking read's (a consumer's reader gets BLOCK_MS + 5 s of its own): after a
            # network fault heals, a process works again within this plus RECONNECT_BACKOFF_MAX
            # (docs/consuming.md "Network faults"). Redis itself calls a script busy after 5 s.
            "SOCKET_TIMEOUT": 5,
            "CONNECTION_POOL_KWARGS": {"health_check_interval": 30},
            **({"CLUSTER_SEEDS": seeds} if seeds else {}),
            **options,
        },
    }
