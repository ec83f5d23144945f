"""System checks for ``settings.DISCOVERY`` (ids discovery_app.E00x / W00x are stable)."""
import math

from django.conf import settings
from django.core.checks import Error, Warning, register

from discovery_app.balancers import STRATEGIES
from discovery_app.defaults import DEFAULTS, SETTINGS
from discovery_app.fallbacks import InvalidFallback, parse_fallback
from shoal_common.appsettings import kind_errors


def _is_number(value):
    # NaN and infinity are floats but no usable number of seconds (NaN even passes "<= 0").
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _fallback_errors(fallbacks):
    if not isinstance(fallbacks, dict):
        return [f"DISCOVERY['FALLBACKS'] must be a dict of service name -> list of URLs, not {type(fallbacks).__name__}."]
    problems = []
    for service, urls in fallbacks.items():
        if isinstance(urls, str) or not isinstance(urls, (list, tuple)):
            problems.append(f"DISCOVERY['FALLBACKS'][{service!r}] must be a list of URLs, not {urls!r}.")
            continue
        for url in urls:
            try:
                parse_fallback(url)
            except InvalidFallback as exc:
                problems.append(f"DISCOVERY['FALLBACKS'][{service!r}]: {exc}.")
    return problems


CACHE_HINT = ("The registry lives in Redis, reached through a django-redis cache: in settings, "
              "CACHES = {'default': shoal_common.cache.redis_cache(REDIS_URL)} (README 'Add Shoal to your project'), "
              "or point DISCOVERY['REDIS_ALIAS'] at a cache with BACKEND 'django_redis.cache.RedisCache'.")


@register()
def check_discovery_settings(app_configs=None, **kwargs):
    user = getattr(settings, "DISCOVERY", {})
    if not isinstance(user, dict):
        return [Error(f"DISCOVERY must be a dict, not {type(user).__name__}.",
                      hint="Write DISCOVERY = {'TTL': 30, ...} in settings; see discovery_app/defaults.py.",
                      id="discovery_app.E001")]
    errors = [
        Error(f"DISCOVERY has an unknown key {key!r}.", hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
              id="discovery_app.E002")
        for key in sorted(set(user) - set(DEFAULTS))
    ]
    merged = {**DEFAULTS, **user}
    errors.extend(kind_errors("DISCOVERY", SETTINGS, merged, "discovery_app"))  # each key against its kind: E003
    if merged["STRATEGY"] not in STRATEGIES:
        errors.append(Error(f"DISCOVERY['STRATEGY'] is {merged['STRATEGY']!r}, which is not a strategy.",
                            hint=f"Choose one of {', '.join(STRATEGIES)}.", id="discovery_app.E004"))
    for problem in _fallback_errors(merged["FALLBACKS"]):
        errors.append(Error(problem, hint="e.g. {'order-service': ['http://10.0.0.5:8000']}", id="discovery_app.E005"))
    ttl, interval = merged["TTL"], merged["HEARTBEAT_INTERVAL"]
    if _is_number(ttl) and _is_number(interval) and ttl > 0 and interval > 0:
        if interval >= ttl:
            errors.append(Error(
                f"DISCOVERY['HEARTBEAT_INTERVAL'] ({interval} s) is not below TTL ({ttl} s): "
                "instances would expire between heartbeats.",
                hint="Heartbeat at a third of the TTL (the defaults are 10 s and 30 s).", id="discovery_app.E006"))
        elif interval > ttl / 2:
            errors.append(Warning(
                f"DISCOVERY['HEARTBEAT_INTERVAL'] ({interval} s) is above half the TTL ({ttl} s): "
                "one late heartbeat expires the instance.",
                hint="Heartbeat at a third of the TTL.", id="discovery_app.W001"))
        factor = merged["HEALTHY_FACTOR"]
        if _is_number(factor) and 0 < factor * ttl <= interval:
            errors.append(Warning(
                f"DISCOVERY['HEALTHY_FACTOR'] x TTL ({factor} x {ttl} s) is not above HEARTBEAT_INTERVAL "
                f"({interval} s): instances count as unhealthy between two on-time heartbeats, and calls fail.",
                hint="Keep HEALTHY_FACTOR x TTL above the heartbeat interval (the defaults: 1.5 x 30 s vs 10 s).",
                id="discovery_app.W002"))
    if merged["ZONE"] is not None and not isinstance(merged["ZONE"], str):
        errors.append(Error(f"DISCOVERY['ZONE'] must be a string or None, not {merged['ZONE']!r}.",
                            id="discovery_app.E007"))
    prefix = merged["KEY_PREFIX"]
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        errors.append(Error(f"DISCOVERY['KEY_PREFIX'] must be a non-empty string without braces, not {prefix!r}.",
                            id="discovery_app.E008"))
    alias = merged["REDIS_ALIAS"]
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        errors.append(Error(f"DISCOVERY['REDIS_ALIAS'] is {alias!r}, which is not in CACHES.",
                            hint=CACHE_HINT, id="discovery_app.E009"))
    elif "django_redis" not in caches[alias].get("BACKEND", ""):
        errors.append(Error(f"CACHES[{alias!r}] does not use django-redis.",
                            hint=CACHE_HINT, id="discovery_app.E009"))
    return errors
