"""System checks for ``settings.STREAMS`` (ids streams_app.E00x / W00x are stable)."""
from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Warning, register

from shoal_common.appsettings import kind_errors
from streams_app.defaults import DEFAULTS, SETTINGS


CACHE_HINT = ("Shoal reaches Redis through a django-redis cache: in settings, "
              "CACHES = {'default': shoal_common.cache.redis_cache(REDIS_URL)} (README 'Add Shoal to your project'), "
              "or point STREAMS['REDIS_ALIAS'] at a cache with BACKEND 'django_redis.cache.RedisCache'.")


@register()
def check_installed_apps(app_configs=None, **kwargs):
    # The admin pages of both apps extend shoal_common's templates: without it they fail at the first click.
    if apps.is_installed("shoal_common"):
        return []
    return [Error("'shoal_common' is not in INSTALLED_APPS; the Streams admin pages need its templates.",
                  hint="INSTALLED_APPS += ['shoal_common', 'streams_app', 'discovery_app'] "
                       "(README 'Add Shoal to your project').", id="streams_app.E040")]


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
    # Each key against its kind in the table (E003; BROADCAST_CHANNEL, a non-empty string: E020).
    errors.extend(kind_errors("STREAMS", SETTINGS, merged, "streams_app"))
    alias = merged["REDIS_ALIAS"]
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        errors.append(
            Error(
                f"STREAMS['REDIS_ALIAS'] is {alias!r}, which is not in CACHES.",
                hint=CACHE_HINT,
                id="streams_app.E004",
            )
        )
    elif "django_redis" not in caches[alias].get("BACKEND", ""):
        errors.append(
            Error(
                f"CACHES[{alias!r}] does not use django-redis.",
                hint=CACHE_HINT,
                id="streams_app.E005",
            )
        )
    else:
        errors.extend(_location_errors(alias, caches[alias].get("LOCATION")))
        errors.extend(_seed_errors(alias, caches[alias].get("OPTIONS", {}).get("CLUSTER_SEEDS")))
        timeout = caches[alias].get("OPTIONS", {}).get("SOCKET_TIMEOUT")
        admin_timeout = merged["ADMIN_REDIS_TIMEOUT"]
        if (timeout is not None and isinstance(admin_timeout, (int, float)) and not isinstance(admin_timeout, bool)
                and admin_timeout >= timeout):
            errors.append(
                Warning(
                    f"STREAMS['ADMIN_REDIS_TIMEOUT'] ({admin_timeout} s) is not below CACHES[{alias!r}] "
                    f"SOCKET_TIMEOUT ({timeout} s).",
                    hint="Admin pages would wait on a hung Redis as long as every other command does; keep it a few "
                         "seconds (the default is 2).",
                    id="streams_app.W003",
                )
            )
    if isinstance(merged["PENDING_TIMEOUT_MS"], int) and isinstance(merged["BLOCK_MS"], int):
        if merged["PENDING_TIMEOUT_MS"] <= merged["BLOCK_MS"]:
            errors.append(
                Warning(
                    "STREAMS['PENDING_TIMEOUT_MS'] is not above BLOCK_MS: a worker renews the entries it "
                    "holds every quarter of the pending timeout, and a blocked read may delay that renewal.",
                    hint="Keep PENDING_TIMEOUT_MS well above BLOCK_MS and above the pauses a live process may "
                         "have (GC, VM migration); handlers may run longer than it.",
                    id="streams_app.W002",
                )
            )
    errors.extend(_check_supervisor(merged))
    errors.extend(_check_codec(merged["CODEC"]))
    errors.extend(_check_partitions(merged))
    errors.extend(_check_leases(merged))
    return errors


# Below this a lease lapses at the first GC pause, scheduling delay or slow reply, and another consumer
# runs the partition's entries again (a trial with a 30 ms lease ran 21% of the entries twice).
LEASE_TTL_FLOOR_MS = 1000


def _check_leases(merged):
    ttl, interval = merged["LEASE_TTL_MS"], merged["LEASE_INTERVAL_MS"]
    numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (ttl, interval))
    if not numbers:
        return []
    problems = []
    if interval * 3 > ttl:
        # One late or failed renewal must not cost a live consumer its partitions: two may fail.
        problems.append(Error(
            f"STREAMS['LEASE_INTERVAL_MS'] ({interval} ms) is above a third of LEASE_TTL_MS ({ttl} ms): an ordered "
            "consumer's leases would lapse after one or two late renewals.",
            hint="Renew at least three times per lease (LEASE_INTERVAL_MS at most LEASE_TTL_MS / 3): e.g. "
                 "LEASE_TTL_MS 10000 with LEASE_INTERVAL_MS 2000.",
            id="streams_app.E032"))
    if 0 < ttl < LEASE_TTL_FLOOR_MS:
        problems.append(Warning(
            f"STREAMS['LEASE_TTL_MS'] ({ttl} ms) is below {LEASE_TTL_FLOOR_MS} ms: an ordered consumer's leases "
            "would lapse at a GC pause, a scheduling delay or a slow Redis reply, and another consumer would run "
            "the partition's entries again (a 30 ms lease ran 21% of the entries twice).",
            hint="Keep LEASE_TTL_MS at 1000 ms or more (default 10000): it bounds the takeover time after a crash, "
                 "not the latency of a healthy partition.",
            id="streams_app.W032"))
    return problems


def _check_partitions(merged):
    partitions = merged["PARTITIONS"]
    hint = "Write STREAMS['PARTITIONS'] = {'orders': 6}: stream names to a partition count from 1 to 1024."
    if not isinstance(partitions, dict):
        return [Error(f"STREAMS['PARTITIONS'] must be a dict, not {type(partitions).__name__}.", hint=hint,
                      id="streams_app.E031")]
    errors = []
    for stream, count in partitions.items():
        if not isinstance(stream, str) or not stream or "{" in stream or "}" in stream:
            errors.append(Error(f"STREAMS['PARTITIONS'] has an invalid stream name {stream!r}.", hint=hint,
                                id="streams_app.E031"))
        elif isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1024:
            errors.append(Error(f"STREAMS['PARTITIONS'][{stream!r}] must be an integer from 1 to 1024, not {count!r}.",
                                hint=hint, id="streams_app.E031"))
    return errors


def _check_codec(name):
    from streams_app.publishing.codec import ENGINES, engine_error

    if name not in ENGINES:
        return [Error(f"STREAMS['CODEC'] is {name!r}, which is not a codec.",
                      hint=f"Use one of {', '.join(map(repr, ENGINES))} (default 'orjson').", id="streams_app.E030")]
    problem = engine_error(name)
    if problem:
        return [Error(f"STREAMS['CODEC'] is {name!r}, but {problem}.", hint=f"pip install {name} (a dependency of django-shoal), or set STREAMS['CODEC'] = 'json'.",
                      id="streams_app.E030")]
    return []


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


def _seed_errors(alias, seeds):
    """Several seed nodes of a Redis Cluster (REDIS_URL=redis+cluster://h1:p1,h2:p2/0, which
    shoal_common.cache.redis_cache puts in OPTIONS["CLUSTER_SEEDS"]): each must be HOST:PORT."""
    from shoal_common.redisconn import seed_node

    if seeds is None:
        return []
    if isinstance(seeds, str) or not isinstance(seeds, (list, tuple)) or not seeds:
        problems = [f"a list of HOST:PORT strings is needed, not {seeds!r}"]
    else:
        problems = []
        for seed in seeds:
            try:
                seed_node(seed if isinstance(seed, str) else "")
            except ValueError:
                problems.append(f"seed {seed!r} is not HOST:PORT")
    return [Error(f"CACHES[{alias!r}] OPTIONS['CLUSTER_SEEDS']: {'; '.join(problems)}",
                  hint="Name a cluster's seed nodes comma-separated in REDIS_URL, "
                       "redis+cluster://HOST1:PORT1,HOST2:PORT2/0, each with its port.",
                  id="streams_app.E041")] if problems else []


def _location_errors(alias, location):
    """A LOCATION redis-py cannot parse fails every command with a traceback: say so at check time
    (nothing is connected here: the URL is only parsed)."""
    from redis.connection import parse_url

    for url in location if isinstance(location, (list, tuple)) else [location]:
        if isinstance(url, str) and url.startswith("redis+cluster://"):
            url = "redis://" + url[len("redis+cluster://"):]  # Shoal's own scheme for a cluster
        try:
            if not isinstance(url, str):
                raise ValueError(f"a URL string is needed, not {type(url).__name__}")
            parse_url(url)
        except ValueError as exc:
            return [Error(f"CACHES[{alias!r}] LOCATION {url!r} is not a Redis URL: {exc}",
                          hint="Set REDIS_URL (or LOCATION) to redis://HOST:PORT/DB, rediss://… for TLS, "
                               "or unix:///path/to/redis.sock.",
                          id="streams_app.E041")]
    return []


@register()
def check_live_partitions(app_configs=None, **kwargs):
    """W031: STREAMS["PARTITIONS"] names another count than the live layout (``manage.py repartition``
    changed it; the setting only says how a stream starts). Asks Redis, within ADMIN_REDIS_TIMEOUT;
    silent when it does not answer (nothing to compare with)."""
    from streams_app.partitioning import layout
    from streams_app.conf import setting
    from streams_app.redis.connection import web_connection

    declared = setting("PARTITIONS") or {}
    if not isinstance(declared, dict) or not declared:
        return []
    try:
        conn = web_connection()
        live = {stream: layout.read(conn, stream) for stream in sorted(declared) if isinstance(stream, str)}
    except Exception:  # noqa: BLE001 - Redis down, not configured, no cache: nothing to compare with
        return []
    warnings = []
    for stream, record in live.items():
        if record is None or len(record.names) == declared[stream]:
            continue
        warnings.append(Warning(
            f"STREAMS['PARTITIONS'][{stream!r}] is {declared[stream]!r}, but {stream!r} has {len(record.names)} "
            f"partitions in Redis (epoch {record.epoch}, {record.state}; changed by manage.py repartition). The live "
            "layout is used; the setting is not.",
            hint=f"Write STREAMS['PARTITIONS'] = {{..., {stream!r}: {len(record.names)}}} so that the settings say "
                 "what runs (docs/cluster.md, \"Repartitioning online\").",
            id="streams_app.W031"))
    return warnings
