"""``DiscoveryClient``: resolve a service name to one healthy instance, from a local cache.

Per call: cached instances (refreshed every CACHE_TTL, or at once on a change event) -> healthy
ones (heartbeat younger than HEALTHY_FACTOR x TTL) -> those whose circuit breaker is not open
(none left: panic, use them all) -> the caller's zone when it has any -> the strategy picks.
With Redis unreachable it serves the last instances it saw (stale-if-error); with none
registered it uses the FALLBACKS from settings.
"""
import logging
import os
import threading
import time
import weakref
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

from discovery_app import keys
from discovery_app.balancers import key_of, make_strategy
from discovery_app.breaker import Breakers
from discovery_app.conf import get_settings
from discovery_app.connection import TRANSIENT_ERRORS
from discovery_app.exceptions import ServiceNotAvailable
from discovery_app.instance import Instance
from discovery_app.listener import ChangeListener
from discovery_app.registry import ServiceRegistry
from shoal_common.backoff import backoff_delay

logger = logging.getLogger("discovery_app.client")

_UNSET = object()
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


@dataclass
class _Entry:
    instances: list
    fetched_at: float  # client monotonic clock; -inf once invalidated
    clock_offset: float  # Redis server time minus local time.time(), at the fetch


class Call:
    """Yielded by ``track()``: call ``fail()`` when the instance misbehaved without raising (a 5xx)."""

    def __init__(self, instance):
        self.instance = instance
        self.failed = False

    def fail(self):
        self.failed = True


# Every client of this process, so that a broadcast ("discovery.invalidate") reaches them all.
_clients = weakref.WeakSet()


def invalidate(service=None):
    """Drop ``service`` (None: everything) from the cache of every DiscoveryClient in this process."""
    for client in list(_clients):
        client.invalidate(service)


def fallback_instances(service, urls):
    found = []
    for url in urls:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found.append(Instance(service=service, instance_id=f"fallback:{url}", address=parts.hostname,
                              port=port, scheme=parts.scheme or "http", ttl=0.0))
    return found


class DiscoveryClient:
    def __init__(self, strategy=None, registry=None, *, zone=_UNSET, cache_ttl=None, fallbacks=None,
                 listen=None, breaker_failures=None, breaker_cooldown=None, rng=None, clock=time.monotonic):
        config = get_settings()
        self.strategy = make_strategy(strategy or config["STRATEGY"], rng=rng)
        self.registry = registry or ServiceRegistry()
        self.zone = config["ZONE"] if zone is _UNSET else zone
        self.cache_ttl = config["CACHE_TTL"] if cache_ttl is None else cache_ttl
        self.fallbacks = config["FALLBACKS"] if fallbacks is None else fallbacks
        self.listen = config["LISTEN"] if listen is None else listen
        self.healthy_factor = config["HEALTHY_FACTOR"]
        self.backoff_max = config["RETRY_BACKOFF_MAX"]
        self.http_timeout = config["HTTP_TIMEOUT"]
        self.clock = clock
        self.breakers = Breakers(
            config["BREAKER_FAILURES"] if breaker_failures is None else breaker_failures,
            config["BREAKER_COOLDOWN"] if breaker_cooldown is None else breaker_cooldown,
            clock=clock,
        )
        self._cache: dict[str, _Entry] = {}
        self._inflight = defaultdict(int)
        self._lock = threading.Lock()
        self._registry_down_until = float("-inf")
        self._backoff = 0.0
        self._failures = 0  # registry fetches failed in a row (the back-off doubles with each)
        self._last_error = None
        self._degraded: dict[str, str] = {}  # service -> "stale" / "panic", to log once per episode
        self._listener = None
        self._pid = os.getpid()
        self._http = threading.local()
        self._invalidations = defaultdict(int)  # per service: bumped by invalidate(), see _entry
        self._all_invalidations = 0
        _clients.add(self)

    # -- public API ------------------------------------------------------------------------

    def resolve(self, service, exclude=()):
        """One instance of ``service`` to call. ``exclude``: instance ids to avoid if others exist."""
        self._ensure_listener()
        instances, degraded, message = self._usable(service)
        if exclude:
            others = [i for i in instances if key_of(i) not in exclude]
            instances = others or instances
        candidates = [i for i in instances if self.breakers.available(key_of(i))]
        panic = not candidates
        if panic:
            degraded, message = "panic", "every instance's circuit breaker is open; using them all (panic mode)"
        self._note(service, degraded, message)
        if panic:
            candidates = instances
        if self.zone:
            local = [i for i in candidates if i.zone == self.zone]
            candidates = local or candidates
        candidates = list(candidates)
        while candidates:
            instance = self.strategy.pick(service, candidates, self._inflight)
            if panic or self.breakers.acquire(key_of(instance)):
                return instance
            candidates.remove(instance)  # another thread took its half-open trial
        return self.strategy.pick(service, instances, self._inflight)

    def resolve_url(self, service):
        return self.resolve(service).url

    def invalidate(self, service=None):
        """Make the next resolve() of ``service`` (None: every service) ask the registry again.
        The old instances are kept for stale-if-error."""
        with self._lock:
            if service is None:
                self._all_invalidations += 1
            else:
                self._invalidations[service] += 1
            for name in [service] if service is not None else list(self._cache):
                entry = self._cache.get(name)
                if entry is not None:
                    entry.fetched_at = float("-inf")

    def _generation(self, service):
        return self._all_invalidations, self._invalidations[service]

    @contextmanager
    def track(self, instance):
        """Count a call in flight to ``instance`` and feed its breaker with the outcome.

        An OSError escaping the block (connection refused, timeouts: requests' errors are OSErrors)
        or ``call.fail()`` counts as a failure; a clean exit as a success; other exceptions are the
        caller's own and count as neither.
        """
        key = key_of(instance)
        call = Call(instance)
        with self._lock:
            self._inflight[key] += 1
        try:
            yield call
        except OSError:
            call.fail()
            raise
        except BaseException:
            call = None
            raise
        finally:
            with self._lock:
                self._inflight[key] -= 1
                if not self._inflight[key]:
                    del self._inflight[key]
            if call is not None:
                self.report(instance, ok=not call.failed)

    def report(self, instance, ok):
        """Feed an instance's breaker with the outcome of a call made without track()."""
        key = key_of(instance)
        if ok:
            if self.breakers.state(key) != "closed":
                logger.info("Discovery: %s answered again; closing its circuit breaker", key)
            self.breakers.success(key)
        elif self.breakers.failure(key):
            logger.warning("Discovery: opened the circuit breaker of %s (%s) for %.0f s",
                           key, instance.url, self.breakers.cooldown)

    def inflight(self, instance):
        return self._inflight.get(key_of(instance), 0)

    def instances(self, service):
        """The usable instances of ``service`` (cache, health, fallback rules applied; breakers not)."""
        self._ensure_listener()
        return self._usable(service)[0]

    def request(self, service, method, path, **kwargs):
        from discovery_app.http import request

        return request(self, service, method, path, **kwargs)

    def wait_listening(self, timeout=5.0):
        """Block until change events are being received (tests, start-up probes)."""
        self._ensure_listener()
        return self._listener is not None and self._listener.ready.wait(timeout)

    def close(self):
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        session = getattr(self._http, "session", None)
        if session is not None:
            session.close()

    # -- internals -------------------------------------------------------------------------

    def _ensure_listener(self):
        if self._pid != os.getpid():
            # A forked child inherits the object but not the thread (nor may it share the socket),
            # and the parent's calls in flight are not its own.
            self._pid, self._listener = os.getpid(), None
            self._inflight.clear()
        if not self.listen:
            return
        if self._listener is None or not self._listener.alive:
            with self._lock:
                if self._listener is None or not self._listener.alive:
                    self._listener = ChangeListener(
                        keys.events_channel(), self._listener_connection, self.invalidate,
                        lambda: self.invalidate(None), self.backoff_max,
                    ).start()

    def _listener_connection(self):
        import redis

        pool = self.registry.connection.connection_pool
        return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class,
                                                      **pool.connection_kwargs))

    def _usable(self, service):
        """(healthy instances, degraded state or None, message) or ServiceNotAvailable."""
        entry, stale, cached = self._entry(service)
        if stale:
            healthy = entry.instances  # stale-if-error: a registry outage is not their fault
        else:
            healthy = self._healthy(entry)
            if cached and entry.instances and not healthy:
                entry, stale, _ = self._entry(service, force=True)  # the cache may just be old
                healthy = entry.instances if stale else self._healthy(entry)
        if healthy:
            if stale:
                return healthy, "stale", (f"the registry is unreachable ({self._last_error}); "
                                          f"serving the {len(healthy)} last known instances")
            return healthy, None, ""
        fallbacks = self.fallbacks.get(service)
        if fallbacks:
            return fallback_instances(service, fallbacks), "fallback", (
                "no registered instance" + (" (registry unreachable)" if stale else "")
                + "; using the FALLBACKS from settings")
        if stale:
            raise ServiceNotAvailable(service, ServiceNotAvailable.REGISTRY_UNREACHABLE, str(self._last_error))
        if entry.instances:
            raise ServiceNotAvailable(service, ServiceNotAvailable.ALL_UNHEALTHY,
                                      f"{len(entry.instances)} registered, none with a recent heartbeat")
        raise ServiceNotAvailable(service, ServiceNotAvailable.NO_INSTANCES)

    def _healthy(self, entry):
        server_now = time.time() + entry.clock_offset
        return [i for i in entry.instances if i.is_healthy(self.healthy_factor, server_now)]

    def _entry(self, service, force=False):
        """(entry, stale?, from cache?): cached, fetched, or the old one when the registry fails."""
        now = self.clock()
        entry = self._cache.get(service)
        if not force and entry is not None and now - entry.fetched_at < self.cache_ttl:
            return entry, False, True
        if now < self._registry_down_until:
            return self._stale(service, entry)
        generation = self._generation(service)
        try:
            server_time, found = self.registry.fetch(service)
        except TRANSIENT_ERRORS as exc:
            with self._lock:
                self._last_error = exc
                self._failures += 1
                self._backoff = backoff_delay(self._failures, first=0.5, cap=self.backoff_max)
                self._registry_down_until = self.clock() + self._backoff
            return self._stale(service, entry)
        self._backoff = 0.0
        self._failures = 0
        self._registry_down_until = float("-inf")
        entry = _Entry(found, self.clock(), server_time - time.time())
        with self._lock:
            if self._generation(service) != generation:
                # A change event arrived while this fetch was under way: what it read may predate
                # the change, so use it now but fetch again next time.
                entry.fetched_at = float("-inf")
            self._cache[service] = entry
        known = {key_of(i) for e in list(self._cache.values()) for i in e.instances}
        self.breakers.forget(known | {f"fallback:{url}" for urls in self.fallbacks.values() for url in urls})
        return entry, False, False

    def _stale(self, service, entry):
        if entry is None:
            entry = _Entry([], float("-inf"), 0.0)
        return entry, True, False

    def _note(self, service, state, message):
        """Log a degraded state once when it starts, and once when it ends."""
        previous = self._degraded.get(service)
        if previous == state:
            return
        if state is None:
            self._degraded.pop(service, None)
            logger.info("Discovery: %s is back to normal (was %s)", service, previous)
        else:
            self._degraded[service] = state
            logger.warning("Discovery: %s: %s", service, message)
