"""``DiscoveryClient``: resolve a service name to one healthy instance, from a local cache.

Per call: cached instances (refreshed every CACHE_TTL, or at once on a change event) -> healthy
ones (heartbeat younger than HEALTHY_FACTOR x TTL) -> those whose circuit breaker is not open
(none left: panic, use them all) -> the caller's zone when it has any -> the strategy picks.
With Redis unreachable it serves the last instances it saw (stale-if-error); with none
registered it uses the FALLBACKS from settings.

Clients share one change-event listener per process and Redis server (``hub._Hub``), which holds them
only weakly: a dropped client is collected with nothing left behind. Still, make one client per
process and share it: each new client starts with an empty cache and fresh breakers.
"""
from __future__ import annotations

import asyncio
import fnmatch
import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from discovery_app import hub as hubs
from discovery_app.balancers import key_of, make_strategy
from discovery_app.breaker import Breakers
from discovery_app.calls import Call, is_instance_failure
from discovery_app.conf import get_settings
from discovery_app.connection import TRANSIENT_ERRORS
from discovery_app.exceptions import ClientClosed, ServiceNotAvailable
from discovery_app.fallbacks import fallback_instances
from discovery_app.registry import ServiceRegistry
from shoal_common.backoff import backoff_delay

if TYPE_CHECKING:
    import random

    import requests

    from discovery_app.instance import Instance

logger = logging.getLogger("discovery_app.client")

_UNSET = object()


@dataclass
class _Entry:
    instances: list
    fetched_at: float  # client monotonic clock; -inf once invalidated
    clock_offset: float  # Redis server time minus local time.time(), at the fetch
    preserved: dict = field(default_factory=dict)  # instance id -> serve until (client clock); see _preserve
    position: tuple | None = None  # the registry's change position of this read (read_changes)
    # After an incremental read, heartbeats are not re-read: every instance but the ``aging`` ones has
    # its deadline at ``floor`` or later (Redis server time), so its heartbeat is no older than
    # ``floor - ttl`` (see ServiceRegistry.read_changes).
    floor: float = float("-inf")
    aging: frozenset = frozenset()
    lifetime: float = float("inf")  # seconds the entry stays fresh (at most the cache TTL): see _window

    def last_heartbeat(self, instance):
        if instance.instance_id in self.aging:
            return instance.last_heartbeat
        return max(instance.last_heartbeat, self.floor - instance.ttl)

    def is_healthy(self, instance, factor, server_now):
        # A preserved instance is served for its bounded grace even though its heartbeat is old: it
        # expired only because nobody could heartbeat while Redis was unreachable (see _preserve).
        return (instance.is_fallback or instance.instance_id in self.preserved
                or server_now - self.last_heartbeat(instance) < factor * instance.ttl)


MANY_CLIENTS = 100
"""Clients created in one process past which a warning says to share one (one per request is a bug)."""


@dataclass
class _Plan:
    instances: list  # usable (healthy, selected) instances
    candidates: list  # what the strategy picks from
    panic: bool
    let_back: object  # ids let through in spite of an open breaker (MAX_EJECTED)
    degraded: object
    message: str
    entry: object = None  # the cache entry it was computed from (cached plans only)
    breakers_version: int = -1
    breakers_until: float = float("inf")
    healthy_until: float = float("inf")  # Redis server time when the first candidate turns unhealthy


_created = 0


class DiscoveryClient:
    """Resolve a service name to one healthy instance (``resolve``, ``resolve_url``), call it (``request``), and
    report how the call went (``track``, ``report``) for the circuit breakers. An argument left out takes the
    ``DISCOVERY`` setting of its name (``STRATEGY``, ``ZONE``, ``CACHE_TTL``, ...). Make one per process and share it.
    """

    def __init__(self, strategy: str | Any = None, registry: ServiceRegistry | None = None, *, zone: Any = _UNSET,
                 cache_ttl: float | None = None, fallbacks: dict[str, Any] | None = None, listen: bool | None = None,
                 breaker_failures: int | None = None, breaker_cooldown: float | None = None,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        config = get_settings()
        self.strategy = make_strategy(strategy or config["STRATEGY"], rng=rng)
        self.registry = registry or ServiceRegistry()
        self.zone = config["ZONE"] if zone is _UNSET else zone
        self.cache_ttl = config["CACHE_TTL"] if cache_ttl is None else cache_ttl
        self.fallbacks = config["FALLBACKS"] if fallbacks is None else fallbacks
        self.listen = config["LISTEN"] if listen is None else listen
        self.healthy_factor = config["HEALTHY_FACTOR"]
        self.backoff_max = config["RETRY_BACKOFF_MAX"]
        preservation = config["SELF_PRESERVATION"]
        self.self_preservation = config["HEARTBEAT_INTERVAL"] + 5.0 if preservation is None else preservation
        self.http_timeout = config["HTTP_TIMEOUT"]
        self.http_deadline = config["HTTP_DEADLINE"]
        self.retry_read_timeouts = config["RETRY_READ_TIMEOUTS"]
        self.clock = clock
        cooldown = config["BREAKER_COOLDOWN"] if breaker_cooldown is None else breaker_cooldown
        self.breakers = Breakers(
            config["BREAKER_FAILURES"] if breaker_failures is None else breaker_failures, cooldown,
            clock=clock, max_cooldown=max(cooldown, config["BREAKER_MAX_COOLDOWN"]),
        )
        self.panic_threshold = config["PANIC_THRESHOLD"]
        self.max_ejected = config["MAX_EJECTED"]
        self._cache: dict[str, _Entry] = {}
        self._inflight: defaultdict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._registry_down_until = float("-inf")
        self._backoff = 0.0
        self._failures = 0  # registry fetches failed in a row (the back-off doubles with each)
        self._last_error = None
        self._outage_at = float("-inf")  # client clock: when this process last found the registry unreachable
        self._degraded: dict[str, str] = {}  # service -> "stale" / "panic", to log once per episode
        self._hub = None
        self._closed = False
        self._fetching: dict[str, threading.Event] = {}  # service -> set when its refresh ends
        self._plans: dict[str, _Plan] = {}  # service -> what resolve() last picked from
        self.redis_timeout = config["REDIS_TIMEOUT"]
        self._http = threading.local()
        self._invalidations: defaultdict[str, int] = defaultdict(int)  # per service: bumped by invalidate(), see _entry
        self._all_invalidations = 0
        hubs.all_clients.add(self)
        _count_creation()

    def __enter__(self) -> DiscoveryClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- public API ------------------------------------------------------------------------

    def resolve(self, service: str, exclude: Collection[str] = (), *, tags: Collection[str] | None = None,
                version: str | None = None) -> Instance:
        """One instance of ``service`` to call. ``exclude``: instance ids to avoid if others exist;
        ``tags``: only instances carrying all of them; ``version``: only versions matching this
        glob ("2.*", "2.1.0")."""
        self._ensure_listener()
        if not exclude and not tags and version is None:
            plan = self._cached_plan(service)  # the common case: no per-call filtering, O(1)
        else:
            plan = None
        if plan is None:
            instances, degraded, message = self._usable(service)
            instances = _select(service, instances, tags, version)
            if exclude:
                others = [i for i in instances if key_of(i) not in exclude]
                instances = others or instances
            plan = self._plan(instances, degraded, message)
            if not exclude and not tags and version is None:
                self._keep_plan(service, plan)
        self._note(service, plan.degraded, plan.message)
        candidates = plan.candidates
        while candidates:
            instance = self.strategy.pick(service, candidates, self._inflight)
            if plan.panic or key_of(instance) in plan.let_back or self.breakers.acquire(key_of(instance)):
                return instance
            candidates = [i for i in candidates if i is not instance]  # another thread took its half-open trial
        return self.strategy.pick(service, plan.instances, self._inflight)

    def _plan(self, instances, degraded, message):
        """What resolve() picks from: breakers, panic, weights, draining, health checks and zone applied."""
        candidates, let_back = self._not_ejected(instances)
        panic = not candidates or len(candidates) < self.panic_threshold * len(instances)
        if panic:
            degraded, message = "panic", (
                f"{len(instances) - len(candidates)} of {len(instances)} instances' circuit breakers are open "
                f"(panic threshold {self.panic_threshold:.0%} available); using them all (panic mode)")
            candidates = instances
        # Weight 0, drained by an operator, or failing its health check: no new picks while any
        # other instance is left.
        candidates = [i for i in candidates if i.weight > 0 and not i.draining and not i.failing] or list(candidates)
        if self.zone:
            local = [i for i in candidates if i.zone == self.zone]
            candidates = local or candidates
        return _Plan(instances, candidates, panic, let_back, degraded, message)

    def _keep_plan(self, service, plan):
        # Valid while the cache entry, the breakers and every candidate's health stay as they are:
        # resolve() at 10,000 instances must not redo O(n) work per call (it did: 72 calls/s).
        entry = self._cache.get(service)
        if entry is None or plan.degraded not in (None, "panic") or not plan.instances:
            return
        plan.entry, plan.breakers_version = entry, self.breakers.version
        plan.breakers_until = self.breakers.next_change()
        plan.healthy_until = min(entry.last_heartbeat(i) + self.healthy_factor * i.ttl for i in plan.instances
                                 if not i.is_fallback) if any(not i.is_fallback for i in plan.instances) else float("inf")
        self._plans[service] = plan

    def _cached_plan(self, service):
        plan = self._plans.get(service)
        if plan is None:
            return None
        entry = self._cache.get(service)
        now = self.clock()
        if (plan.entry is not entry or not self._fresh(entry, now)
                or plan.breakers_version != self.breakers.version or now >= plan.breakers_until
                or time.time() + entry.clock_offset >= plan.healthy_until):
            return None
        return plan

    def _not_ejected(self, instances):
        """(instances whose breaker lets calls through, ids let back in spite of it): with more than
        MAX_EJECTED of them out, the ones ejected longest ago come back first (Envoy's
        max_ejection_percent)."""
        candidates = [i for i in instances if self.breakers.available(key_of(i))]
        ejected = len(instances) - len(candidates)
        allowed = int(self.max_ejected * len(instances))
        if ejected <= allowed:
            return candidates, ()
        out = sorted((i for i in instances if not self.breakers.available(key_of(i))),
                     key=lambda i: self.breakers.opened_at(key_of(i)) or 0.0)
        back = {key_of(i) for i in out[:ejected - allowed]}
        return [i for i in instances if self.breakers.available(key_of(i)) or key_of(i) in back], back

    def resolve_url(self, service: str, **selectors: Any) -> str:
        return self.resolve(service, **selectors).url

    async def aresolve(self, service: str, exclude: Collection[str] = (), **selectors: Any) -> Instance:
        """``resolve()`` for asyncio code: answers on the loop from a fresh cache, and runs a
        registry fetch (a cache miss or expiry) in a worker thread so the loop never waits on Redis."""
        entry = self._cache.get(service)
        if entry is not None and self._fresh(entry, self.clock()):
            return self.resolve(service, exclude, **selectors)
        return await asyncio.to_thread(functools.partial(self.resolve, service, exclude, **selectors))

    def invalidate(self, service: str | None = None) -> None:
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

    def begin(self, instance: Instance) -> Call:
        """Count a call in flight to ``instance`` until the returned Call's ``finish()``."""
        with self._lock:
            self._inflight[key_of(instance)] += 1
        return Call(self, instance)

    @contextmanager
    def track(self, instance: Instance) -> Iterator[Call]:
        """Count a call in flight to ``instance`` and feed its breaker with the outcome.

        A connection error or timeout escaping the block (see ``is_instance_failure``), or
        ``call.fail()``, counts as a failure; a clean exit as a success; other exceptions (the
        caller's own, such as an invalid header) count as neither.
        """
        call = self.begin(instance)
        try:
            yield call
        except BaseException as exc:
            call.finish(False if is_instance_failure(exc) else None)
            raise
        call.finish(True)

    def report(self, instance: Instance, ok: bool, started: float | None = None) -> None:
        """Feed an instance's breaker with the outcome of a call made without track(); ``started``
        (the client's clock): when the call began, so that a late success cannot close a breaker
        that opened meanwhile."""
        key = key_of(instance)
        if ok:
            before = self.breakers.state(key)
            self.breakers.success(key, started)
            if before != "closed" and self.breakers.state(key) == "closed":
                logger.info("Discovery: %s answered again; closing its circuit breaker", key)
        elif self.breakers.failure(key):
            logger.warning("Discovery: opened the circuit breaker of %s (%s) for %.0f s",
                           key, instance.url, self.breakers.cooldown_of(key))

    def inflight(self, instance: Instance) -> int:
        return self._inflight.get(key_of(instance), 0)

    def instances(self, service: str, *, tags: Collection[str] | None = None,
                  version: str | None = None) -> list[Instance]:
        """The usable instances of ``service`` (cache, health, fallback and tag/version rules applied;
        breakers not)."""
        self._ensure_listener()
        return _select(service, self._usable(service)[0], tags, version)

    def request(self, service: str, method: str, path: str, **kwargs: Any) -> requests.Response:
        from discovery_app.http import request

        return request(self, service, method, path, **kwargs)

    def wait_listening(self, timeout: float = 5.0) -> bool:
        """Block until change events are being received (tests, start-up probes)."""
        self._ensure_listener()
        return self._hub is not None and self._hub.listener.ready.wait(timeout)

    def close(self) -> None:
        """Leave the shared listener and close this thread's HTTP session. The client cannot be
        used afterwards (ClientClosed): a closed client quietly starting again would leak."""
        self._closed = True
        hub, self._hub = self._hub, None
        if hub is not None:
            hubs.leave(hub, self)
        session = getattr(self._http, "session", None)
        if session is not None:
            session.close()

    # -- internals -------------------------------------------------------------------------

    def _ensure_listener(self):
        if self._closed:
            raise ClientClosed("this DiscoveryClient was closed; make a new one (or keep one per process open)")
        if not self.listen:
            return
        hub = self._hub
        if hub is None or not hub.listener.alive:
            if self.clock() < self._registry_down_until:
                return  # the registry is down: tried again with the next refresh, after its back-off
            with self._lock:
                if self._hub is None or not self._hub.listener.alive:
                    try:
                        self._hub = hubs.hub_for(self)
                    except TRANSIENT_ERRORS as exc:
                        # Joining a hub asks Redis whether it is a cluster. Down, the call goes on as
                        # without LISTEN (stale answers, FALLBACKS, ServiceNotAvailable naming the
                        # outage); a raw ConnectionError from here hid all of that.
                        logger.debug("Discovery: change listener not started (%s); trying again later", exc)

    def _reset_after_fork(self):
        self._lock = threading.Lock()
        self.breakers.reset_after_fork()
        if hasattr(self.strategy, "_lock"):
            self.strategy._lock = threading.Lock()
        self._inflight.clear()
        self._fetching = {}
        self._hub = None
        self._http = threading.local()  # the parent's sessions hold the parent's sockets

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
        return [i for i in entry.instances if entry.is_healthy(i, self.healthy_factor, server_now)]

    def _entry(self, service, force=False):
        """(entry, stale?, from cache?): cached, fetched, or the old one when the registry fails."""
        now = self.clock()
        entry = self._cache.get(service)
        if not force and entry is not None and self._fresh(entry, now):
            return entry, False, True
        if now < self._registry_down_until:
            return self._stale(service, entry)
        # Single-flight: one refresh per service at a time. The others take the cached answer at
        # once, or, with nothing cached, wait for that refresh (bounded by its Redis timeout).
        with self._lock:
            flight = self._fetching.get(service)
            leader = flight is None
            if leader:
                flight = self._fetching[service] = threading.Event()
        if not leader:
            # The cached answer at once, unless none of it is healthy any more: then it is no answer
            # (ALL_UNHEALTHY) and this caller waits for the refresh under way, or, if that fails,
            # takes it as stale, like the caller that ran the refresh.
            if entry is not None and entry.instances and self._healthy(entry):
                return entry, False, True
            flight.wait(2 * self.redis_timeout + 1.0)
            fetched = self._cache.get(service)
            if fetched is not None and fetched is not entry:  # the refresh succeeded
                return fetched, False, False
            return self._stale(service, entry)
        try:
            return self._fetch(service, entry)
        finally:
            with self._lock:
                del self._fetching[service]
            flight.set()

    def _fetch(self, service, entry):
        generation = self._generation(service)
        try:
            changes = None
            if entry is not None and entry.position is not None and not entry.preserved:
                # Only what changed since the last read: at 10,000 instances a full read costs Redis
                # ~20 ms in one script and this process ~120 ms of decoding, for every change event.
                window, lifetime = self._window(entry)
                changes = self.registry.read_changes(service, entry.position, window)
            if changes is None:
                read = self.registry.read(service)
        except TRANSIENT_ERRORS as exc:
            with self._lock:
                self._last_error = exc
                self._failures += 1
                self._backoff = backoff_delay(self._failures, first=0.5, cap=self.backoff_max)
                self._registry_down_until = self.clock() + self._backoff
            self._note_outage()
            return self._stale(service, entry)
        self._backoff = 0.0
        self._failures = 0
        self._registry_down_until = float("-inf")
        if changes is not None:
            previous, entry = entry, self._apply(entry, changes)
            entry.lifetime = lifetime
            if self._after_outage():
                entry = self._preserve(service, previous, entry, changes.server_now)
        else:
            entry = self._preserve(service, entry, _Entry(read.instances, self.clock(), read.server_now - time.time(),
                                                          position=read.position), read.server_now)
        with self._lock:
            if self._generation(service) != generation:
                # A change event arrived while this fetch was under way: what it read may predate
                # the change, so use it now but fetch again next time.
                entry.fetched_at = float("-inf")
            self._cache[service] = entry
        known = {key_of(i) for e in list(self._cache.values()) for i in e.instances}
        self.breakers.forget(known | {f"fallback:{url}" for urls in self.fallbacks.values() for url in urls})
        return entry, False, False

    def _fresh(self, entry, now):
        return now - entry.fetched_at < min(self.cache_ttl, entry.lifetime)

    def _window(self, entry):
        """(window, lifetime): how far ahead an incremental read reports deadlines exactly, and how
        long the heartbeat bound it gives the other instances keeps them healthy.

        Half the shortest TTL leaves out every instance that heartbeats on time (registrars beat
        every TTL/3, so their deadline is at least 2/3 of a TTL away) and lists those that missed a
        beat. An instance outside the window beat no earlier than ``window - ttl`` ago, so it stays
        healthy for ``window + (HEALTHY_FACTOR - 1) x ttl``: the entry is refreshed by then. Where
        that is too short (HEALTHY_FACTOR well below 1) the window grows to cover the cache TTL."""
        ttls = [i.ttl for i in entry.instances if not i.is_fallback] or [0.0]
        window = 0.5 * min(ttls)
        lifetime = window + min((self.healthy_factor - 1.0) * ttl for ttl in (min(ttls), max(ttls)))
        if lifetime < 1.0:
            window = self.cache_ttl + 1.0 + max(0.0, 1.0 - self.healthy_factor) * max(ttls)
            lifetime = float("inf")
        return window, lifetime

    def _apply(self, entry, changes):
        by_id = {key_of(i): i for i in entry.instances}
        for instance_id, instance in changes.changed.items():
            if instance is None:
                by_id.pop(instance_id, None)
            else:
                by_id[instance_id] = instance
        aging = set()
        for instance_id, beat in changes.aging.items():
            instance = by_id.get(instance_id)
            if instance is not None:
                aging.add(instance_id)
                if beat != instance.last_heartbeat:
                    by_id[instance_id] = replace(instance, last_heartbeat=beat)
        instances = [by_id[key] for key in sorted(by_id)] if changes.changed else list(by_id.values())
        return _Entry(instances, self.clock(), changes.server_now - time.time(), position=changes.position,
                      floor=changes.server_now + changes.window, aging=frozenset(aging))

    def _note_outage(self):
        """The registry did not answer this process (a fetch, or the hub's expiry sweep, failed)."""
        self._outage_at = self.clock()

    def _after_outage(self):
        # Instances whose deadline passed while Redis was frozen or unreachable expire the moment it
        # answers again (its clock ran on), although their registrars only wait out a back-off.
        return self.self_preservation > 0 and self.clock() - self._outage_at < self.self_preservation

    def _preserve(self, service, previous, entry, server_now):
        """Self-preservation (as Eureka's): keep serving instances that were alive at the previous
        fetch and have vanished without expiring (their heartbeat is younger than their TTL) or
        being deregistered (no tombstone): Redis restarted empty or was flushed, and their next
        heartbeat will register them again. Also those that expired shortly after this process
        found the registry unreachable: nobody could heartbeat then. Given up after
        SELF_PRESERVATION seconds."""
        if not self.self_preservation or previous is None:
            return entry
        now = self.clock()
        after_outage = self._after_outage()
        found = {key_of(i) for i in entry.instances}
        kept = [i for i in previous.instances
                if key_of(i) in previous.preserved and key_of(i) not in found and now < previous.preserved[key_of(i)]]
        vanished = [i for i in previous.instances
                    if key_of(i) not in previous.preserved and key_of(i) not in found and not i.is_fallback
                    and (after_outage or server_now - previous.last_heartbeat(i) < i.ttl)]
        if vanished:
            try:
                removed = self.registry.tombstoned(service, [key_of(i) for i in vanished])
            except TRANSIENT_ERRORS:
                removed = set()
            vanished = [i for i in vanished if key_of(i) not in removed]
            if vanished and after_outage:
                logger.warning("Discovery: %s: %d instance(s) expired right after the registry was unreachable "
                               "(nobody could heartbeat); serving them for up to %.0f s until they register again",
                               service, len(vanished), self.self_preservation)
            elif vanished:
                logger.warning("Discovery: %s: %d instance(s) vanished from the registry without expiring or "
                               "being deregistered (Redis restarted or flushed?); serving them for up to %.0f s "
                               "until they register again", service, len(vanished), self.self_preservation)
        entry.preserved = {key_of(i): previous.preserved.get(key_of(i), now + self.self_preservation)
                           for i in kept + vanished}
        entry.instances = entry.instances + kept + vanished
        return entry

    def _stale(self, service, entry):
        if entry is None:
            entry = _Entry([], float("-inf"), 0.0)
        return entry, True, False

    def _note(self, service, state, message):
        """Log a degraded state once when it starts, and once when it ends."""
        previous = self._degraded.get(service)
        if previous == state:
            return
        if state is None and self._failures:
            # A cached answer while the registry still fails (another thread's refresh was under way):
            # the outage goes on. Only a successful refresh ends it; else every back-off retry of every
            # thread logged the outage again.
            return
        if state is None:
            self._degraded.pop(service, None)
            logger.info("Discovery: %s is back to normal (was %s)", service, previous)
        else:
            self._degraded[service] = state
            logger.warning("Discovery: %s: %s", service, message)


def _select(service, instances, tags, version):
    """The instances carrying every tag in ``tags`` whose version matches the glob ``version``."""
    if not tags and version is None:
        return instances
    wanted = set([tags] if isinstance(tags, str) else tags or ())
    chosen = [i for i in instances if wanted <= set(i.tags)
              and (version is None or fnmatch.fnmatchcase(i.version, version))]
    if not chosen:
        raise ServiceNotAvailable(service, ServiceNotAvailable.NO_MATCH,
                                  f"tags {sorted(wanted)}, version {version!r}; {len(instances)} usable instance(s)")
    return chosen


def _count_creation():
    global _created
    _created += 1
    if _created == MANY_CLIENTS:
        logger.warning("Discovery: %d DiscoveryClient objects made in this process; share one per process "
                       "(each new one starts with an empty cache and fresh breakers)", MANY_CLIENTS)
