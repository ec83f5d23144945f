"""System checks for ``settings.STREAMS`` (ids streams_app.E00x / W00x are stable)."""
import math

from django.conf import settings
from django.core.checks import Error, Warning, register

from streams_app.defaults import DEFAULTS

_POSITIVE_INTS = ("BATCH_SIZE", "BLOCK_MS", "THREADS", "PENDING_TIMEOUT_MS", "CLAIM_INTERVAL_MS", "MAX_PAYLOAD_BYTES",
                  "ERROR_TTL", "IDEMPOTENCY_TTL", "SNAPSHOT_RETENTION", "TARGET_LAG", "CRASH_LIMIT")
_POSITIVE_NUMBERS = ("SHUTDOWN_TIMEOUT", "CONSUMER_TTL", "RECONNECT_BACKOFF_MAX", "RETRY_BACKOFF", "RETRY_BACKOFF_MAX",
                     "RECLAIM_INTERVAL", "DEAD_CONSUMER_IDLE", "SNAPSHOT_INTERVAL", "SCALE_INTERVAL",
                     "HEARTBEAT_INTERVAL", "HEARTBEAT_TIMEOUT", "RESTART_DELAY", "CRASH_WINDOW")


@register()
def check_streams_settings(app_configs=None, **kwargs):
    user = getattr(settings, "STREAMS", {})
    if not isinstance(user, dict):
        return [
            Error(
                f"STREAMS must be a dict, not {type(user).__name__}.",
                hint="Write STREAMS = {'BATCH_SIZE': 100, ...} in settings; see streams_app/defaults.py.",
                id="streams_app.E001",
            )
        ]
    errors = []
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            Error(
                f"STREAMS has an unknown key {key!r}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="streams_app.E002",
            )
        )
    merged = {**DEFAULTS, **user}
    for key in _POSITIVE_INTS:
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            errors.append(
                Error(f"STREAMS[{key!r}] must be a positive integer, not {value!r}.", id="streams_app.E003")
            )
    for key in _POSITIVE_NUMBERS:
        value = merged[key]
        # NaN compares false with everything, so "value <= 0" alone lets it through; inf never elapses.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            errors.append(Error(f"STREAMS[{key!r}] must be a positive number, not {value!r}.", id="streams_app.E003"))
    alias = merged["REDIS_ALIAS"]
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        errors.append(
            Error(
                f"STREAMS['REDIS_ALIAS'] is {alias!r}, which is not in CACHES.",
                hint="Point it at a django-redis cache alias.",
                id="streams_app.E004",
            )
        )
    elif "django_redis" not in caches[alias].get("BACKEND", ""):
        errors.append(
            Error(
                f"CACHES[{alias!r}] does not use django-redis.",
                hint="Use BACKEND 'django_redis.cache.RedisCache' so Shoal can get a Redis connection.",
                id="streams_app.E005",
            )
        )
    else:
        timeout = caches[alias].get("OPTIONS", {}).get("SOCKET_TIMEOUT")
        block_ms = merged["BLOCK_MS"]
        if timeout is not None and isinstance(block_ms, int) and timeout * 1000 <= block_ms:
            errors.append(
                Warning(
                    f"STREAMS['BLOCK_MS'] ({block_ms} ms) is not below CACHES[{alias!r}] SOCKET_TIMEOUT ({timeout} s).",
                    hint="A blocking read would time out as a connection error; lower BLOCK_MS or raise SOCKET_TIMEOUT.",
                    id="streams_app.W001",
                )
            )
    if isinstance(merged["PENDING_TIMEOUT_MS"], int) and isinstance(merged["BLOCK_MS"], int):
        if merged["PENDING_TIMEOUT_MS"] <= merged["BLOCK_MS"]:
            errors.append(
                Warning(
                    "STREAMS['PENDING_TIMEOUT_MS'] is not above BLOCK_MS: entries still being handled "
                    "may be claimed by another consumer and handled twice.",
                    hint="Keep PENDING_TIMEOUT_MS well above the longest handler run.",
                    id="streams_app.W002",
                )
            )
    channel = merged["BROADCAST_CHANNEL"]
    if not isinstance(channel, str) or not channel.strip():
        errors.append(
            Error(
                f"STREAMS['BROADCAST_CHANNEL'] must be a non-empty string, not {channel!r}.",
                hint="Name the Redis pub/sub channel of broadcasts, e.g. 'shoal:broadcast'.",
                id="streams_app.E020",
            )
        )
    errors.extend(_check_supervisor(merged))
    return errors


def _check_supervisor(merged):
    interval, timeout = merged["HEARTBEAT_INTERVAL"], merged["HEARTBEAT_TIMEOUT"]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (interval, timeout))
    if numbers and timeout <= 2 * max(interval, 1):
        # A worker's main loop wakes at least once a second, so it beats at most that often.
        return [
            Warning(
                f"STREAMS['HEARTBEAT_TIMEOUT'] ({timeout} s) is not above twice HEARTBEAT_INTERVAL ({interval} s, "
                "at least 1 s): the supervisor may kill healthy workers between two heartbeats.",
                hint="Raise HEARTBEAT_TIMEOUT or lower HEARTBEAT_INTERVAL.",
                id="streams_app.W010",
            )
        ]
    return []


def settings_errors():
    """The serious problems of STREAMS, as one line each: for commands that must not start with them."""
    return [f"{e.id}: {e.msg}" for e in check_streams_settings() if e.is_serious()]
