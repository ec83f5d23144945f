"""Defaults for ``settings.DISCOVERY``. Each key may be overridden there; ``discovery_app.conf`` merges them."""

REDIS_ALIAS = "default"
"""The django-redis cache alias whose connection the registry uses."""

KEY_PREFIX = "discovery"
"""First part of every registry key and of the events channel (``discovery:{orders}:instances``)."""

TTL = 30.0
"""Seconds an instance stays registered without a heartbeat. Pruned atomically once it lapses."""

HEARTBEAT_INTERVAL = 10.0
"""Seconds between a Registrar's heartbeats. Must be below TTL; a third of it survives two lost beats."""

HEALTHY_FACTOR = 1.5
"""A cached instance counts as healthy while its heartbeat is younger than HEALTHY_FACTOR x its TTL."""

TOMBSTONE_TTL = 3600.0
"""Seconds a deregistered instance id is remembered, so that its late heartbeat cannot resurrect it."""

CACHE_TTL = 30.0
"""Seconds a DiscoveryClient keeps a service's instances before asking the registry again.
Change events (pub/sub) drop an entry earlier."""

LISTEN = True
"""Whether clients subscribe to change events to drop cache entries at once (one connection per client)."""

STRATEGY = "power-of-two-choices"
"""Default load-balancing strategy: round-robin, random, weighted-random, least-connections,
power-of-two-choices."""

ZONE = None
"""The caller's zone. Instances in it are preferred while any of them is healthy. None: no preference."""

FALLBACKS = {}
"""Service name -> list of base URLs used when the registry has no instance of it,
e.g. {"order-service": ["http://10.0.0.5:8000"]}."""

BREAKER_FAILURES = 5
"""Consecutive failures that open an instance's circuit breaker."""

BREAKER_COOLDOWN = 30.0
"""Seconds an open breaker keeps its instance out before one trial call (half-open) is let through."""

RETRY_BACKOFF_MAX = 10.0
"""Ceiling, in seconds, of the back-off between attempts to reach an unreachable registry."""

HTTP_TIMEOUT = 10.0
"""Default timeout, in seconds, of ``DiscoveryClient.request`` (connect and read each)."""

DEFAULTS = {
    "REDIS_ALIAS": REDIS_ALIAS,
    "KEY_PREFIX": KEY_PREFIX,
    "TTL": TTL,
    "HEARTBEAT_INTERVAL": HEARTBEAT_INTERVAL,
    "HEALTHY_FACTOR": HEALTHY_FACTOR,
    "TOMBSTONE_TTL": TOMBSTONE_TTL,
    "CACHE_TTL": CACHE_TTL,
    "LISTEN": LISTEN,
    "STRATEGY": STRATEGY,
    "ZONE": ZONE,
    "FALLBACKS": FALLBACKS,
    "BREAKER_FAILURES": BREAKER_FAILURES,
    "BREAKER_COOLDOWN": BREAKER_COOLDOWN,
    "RETRY_BACKOFF_MAX": RETRY_BACKOFF_MAX,
    "HTTP_TIMEOUT": HTTP_TIMEOUT,
}
