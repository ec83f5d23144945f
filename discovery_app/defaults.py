"""Every key of ``settings.DISCOVERY``: its default, kind and meaning, in one table.

``discovery_app.conf`` merges ``DISCOVERY`` over ``DEFAULTS``; the system checks (discovery_app/checks.py)
check each key against its kind; docs/settings.md shows the table (``python -m project.settings_docs``
writes it, and a test fails when the docs drift). Add a key here, and only here.
"""

import math

from shoal_common.appsettings import BOOLEAN, POSITIVE_INT, POSITIVE_NUMBER, Kind, Setting, defaults_of

# Kinds that checks of discovery_app's own validate (ids in docs/settings.md).
CACHE_ALIAS = Kind("django-redis cache alias")  # E009
KEY_PREFIX = Kind("non-empty string without braces")  # E008
STRATEGY_NAME = Kind("strategy name")  # E004
ZONE_NAME = Kind("string or None")  # E007
FALLBACK_URLS = Kind("service -> list of http(s) URLs")  # E005


def _seconds_or_none(minimum_exclusive):
    def accepts(value):
        if value is None:
            return True
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return number and (value > 0 if minimum_exclusive else value >= 0)
    return accepts


POSITIVE_SECONDS_OR_NONE = Kind("positive number of seconds or None", _seconds_or_none(True))
SECONDS_OR_NONE = Kind("number of seconds >= 0 or None", _seconds_or_none(False))
SHARE = Kind("share from 0 to 1", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1)

SETTINGS = (
    Setting("REDIS_ALIAS", "default", CACHE_ALIAS,
            "The django-redis cache alias whose connection the registry uses."),
    Setting("KEY_PREFIX", "discovery", KEY_PREFIX,
            "First part of every registry key and of the events channel (``discovery:{orders}:instances``)."),
    Setting("REDIS_TIMEOUT", 1.0, POSITIVE_NUMBER,
            "Seconds any one discovery call to Redis may take (socket and connect timeout of discovery's own "
            "clients). A hung Redis then costs one resolve() about this long, once per service (single-flight), "
            "and the client serves its cached instances; not the shared pool's SOCKET_TIMEOUT (5 s)."),
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
    Setting("SELF_PRESERVATION", None, SECONDS_OR_NONE,
            "Seconds a client keeps serving instances that vanished from the registry without expiring or being "
            "deregistered (Redis restarted empty, or flushed), or that expired right after this process found "
            "Redis unreachable (frozen past the TTL), until their heartbeats register them again. "
            "None: HEARTBEAT_INTERVAL + 5 s. 0: trust an empty registry at once.", check_id="E010"),
    Setting("LISTEN", True, BOOLEAN,
            "Whether clients subscribe to change events to drop cache entries at once (one listener thread and "
            "connection per process and Redis server, shared by its clients)."),
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
    Setting("BREAKER_MAX_COOLDOWN", 300.0, POSITIVE_NUMBER,
            "Ceiling of a repeat offender's ejection: the k-th ejection in a row lasts BREAKER_COOLDOWN x 2^(k-1) "
            "(plus up to 10 % jitter), at most this many seconds."),
    Setting("PANIC_THRESHOLD", 0.5, SHARE,
            "Panic mode (use every instance, open breakers or not) when fewer than this share of a service's "
            "healthy instances have a breaker that lets calls through, as Envoy's healthy_panic_threshold. "
            "0: only when none is left.", check_id="E010"),
    Setting("MAX_EJECTED", 1.0, SHARE,
            "At most this share of a service's instances is kept out by open breakers; beyond it the ones "
            "ejected longest ago are used again (Envoy's max_ejection_percent). 1.0: no cap.", check_id="E010"),
    Setting("RETRY_BACKOFF_MAX", 10.0, POSITIVE_NUMBER,
            "Ceiling, in seconds, of the back-off between attempts to reach an unreachable registry."),
    Setting("HTTP_TIMEOUT", 10.0, POSITIVE_NUMBER,
            "Default timeout, in seconds, of ``DiscoveryClient.request``: for connecting, and for each read "
            "(not for the whole body; see HTTP_DEADLINE)."),
    Setting("RETRY_READ_TIMEOUTS", True, BOOLEAN,
            "Whether ``request()`` resends an idempotent call to another instance after a read timeout (the "
            "first instance got the request and may still be working on it). A connect timeout, where nothing "
            "was sent, is always retried.", check_id="E010"),
    Setting("HTTP_DEADLINE", None, POSITIVE_SECONDS_OR_NONE,
            "Default total time limit, in seconds, of one ``request()`` call: attempts, retries and reading the "
            "body. None: only HTTP_TIMEOUT, which applies to each read, so a body trickling in without ever "
            "pausing that long can take any time.", check_id="E010"),
)

DEFAULTS = defaults_of(SETTINGS)

