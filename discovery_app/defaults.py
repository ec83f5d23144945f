"""Every key of ``settings.DISCOVERY``: its default, kind and meaning, in one table.

``discovery_app.conf`` merges ``DISCOVERY`` over ``DEFAULTS``; the system checks (discovery_app/checks.py)
check each key against its kind; docs/settings.md shows the table (``python -m project.settings_docs``
writes it, and a test fails when the docs drift). Add a key here, and only here.
"""

from shoal_common.appsettings import BOOLEAN, POSITIVE_INT, POSITIVE_NUMBER, Kind, Setting, defaults_of

# Kinds that checks of discovery_app's own validate (ids in docs/settings.md).
CACHE_ALIAS = Kind("django-redis cache alias")  # E009
KEY_PREFIX = Kind("non-empty string without braces")  # E008
STRATEGY_NAME = Kind("strategy name")  # E004
ZONE_NAME = Kind("string or None")  # E007
FALLBACK_URLS = Kind("service -> list of http(s) URLs")  # E005

SETTINGS = (
    Setting("REDIS_ALIAS", "default", CACHE_ALIAS,
            "The django-redis cache alias whose connection the registry uses."),
    Setting("KEY_PREFIX", "discovery", KEY_PREFIX,
            "First part of every registry key and of the events channel (``discovery:{orders}:instances``)."),
    Setting("TTL", 30.0, POSITIVE_NUMBER,
            "Seconds an instance stays registered without a heartbeat. Pruned atomically once it lapses."),
    Setting("HEARTBEAT_INTERVAL", 10.0, POSITIVE_NUMBER,
            "Seconds between a Registrar's heartbeats. Must be below TTL; a third of it survives two lost beats."),
    Setting("HEALTHY_FACTOR", 1.5, POSITIVE_NUMBER,
            "A cached instance counts as healthy while its heartbeat is younger than HEALTHY_FACTOR x its TTL."),
    Setting("TOMBSTONE_TTL", 3600.0, POSITIVE_NUMBER,
            "Seconds a deregistered instance id is remembered, so that its late heartbeat cannot resurrect it."),
    Setting("CACHE_TTL", 30.0, POSITIVE_NUMBER,
            "Seconds a DiscoveryClient keeps a service's instances before asking the registry again. "
            "Change events (pub/sub) drop an entry earlier."),
    Setting("LISTEN", True, BOOLEAN,
            "Whether clients subscribe to change events to drop cache entries at once (one connection per client)."),
    Setting("STRATEGY", "power-of-two-choices", STRATEGY_NAME,
            "Default load-balancing strategy: round-robin, random, weighted-random, least-connections, "
            "power-of-two-choices."),
    Setting("ZONE", None, ZONE_NAME,
            "The caller's zone. Instances in it are preferred while any of them is healthy. None: no preference."),
    Setting("FALLBACKS", {}, FALLBACK_URLS,
            "Service name -> list of base URLs used when the registry has no instance of it, "
            "e.g. {\"order-service\": [\"http://10.0.0.5:8000\"]}."),
    Setting("BREAKER_FAILURES", 5, POSITIVE_INT,
            "Consecutive failures that open an instance's circuit breaker."),
    Setting("BREAKER_COOLDOWN", 30.0, POSITIVE_NUMBER,
            "Seconds an open breaker keeps its instance out before one trial call (half-open) is let through."),
    Setting("RETRY_BACKOFF_MAX", 10.0, POSITIVE_NUMBER,
            "Ceiling, in seconds, of the back-off between attempts to reach an unreachable registry."),
    Setting("HTTP_TIMEOUT", 10.0, POSITIVE_NUMBER,
            "Default timeout, in seconds, of ``DiscoveryClient.request`` (connect and read each)."),
)

DEFAULTS = defaults_of(SETTINGS)

