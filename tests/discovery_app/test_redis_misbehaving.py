"""Discovery against a Redis that hangs (SIGSTOP) or comes back empty (restarted without persistence)."""
import signal
import threading
import time

import pytest
import redis

from discovery_app.client import DiscoveryClient
from discovery_app.exceptions import ServiceNotAvailable
from discovery_app.registrar import Registrar
from discovery_app.registry import ServiceRegistry
from discovery_app.short_timeout import registry_connection
from tests.netproxy import NetProxy
from tests.waiting import wait_for


class CountingRegistry(ServiceRegistry):
    """The real registry, counting the fetches that reach Redis (a spy, not a stand-in)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fetches = 0

    def read(self, service):
        self.fetches += 1
        return super().read(service)

    def read_changes(self, service, position, window, most=1000):
        self.fetches += 1
        return super().read_changes(service, position, window, most)


@pytest.fixture
def private_redis(redis_factory, use_redis):
    server = redis_factory()
    use_redis(server)
    yield server
    server.process.send_signal(signal.SIGCONT)  # in case the test stopped it


def test_a_hung_redis_costs_one_short_timeout_and_callers_get_the_cached_answer(private_redis, settings, clock):
    settings.DISCOVERY = {"REDIS_TIMEOUT": 0.5}
    ServiceRegistry().register("web", "127.0.0.1", 1)
    registry = CountingRegistry()
    client = DiscoveryClient(registry=registry, listen=False, cache_ttl=5, clock=clock)
    assert client.resolve("web").port == 1
    private_redis.process.send_signal(signal.SIGSTOP)  # hung: connections open, nothing answers
    clock.advance(10)  # the cache entry has expired
    results = []

    def caller():
        started = time.monotonic()
        instance = client.resolve("web")
        results.append((instance.port, time.monotonic() - started))

    threads = [threading.Thread(target=caller) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    assert [port for port, _ in results] == [1] * 8  # the stale answer, for everyone
    # One refresh went to Redis (single-flight); the others were answered from the cache at once.
    assert registry.fetches == 2
    # Bounded by the 0.5 s discovery timeout (plus a loaded machine), not the shared pool's 30 s.
    assert max(seconds for _, seconds in results) < 10, results


def test_while_a_refresh_hangs_other_callers_get_the_stale_instances_not_all_unhealthy(private_redis, settings, clock):
    # Found by a user trial: during an outage, once the cached heartbeats had aged past HEALTHY_FACTOR
    # x TTL, a caller that found another thread's refresh under way took the cache as fresh, found no
    # healthy instance in it and raised ServiceNotAvailable(ALL_UNHEALTHY) while instances were cached.
    settings.DISCOVERY = {"REDIS_TIMEOUT": 3.0}
    ServiceRegistry(ttl=1).register("web", "127.0.0.1", 1)
    client = DiscoveryClient(listen=False, cache_ttl=5, clock=clock)
    assert client.resolve("web").port == 1
    entry = client._cache["web"]
    private_redis.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: not client._healthy(entry), timeout=30, what="the cached heartbeat older than 1.5 x TTL")
        clock.advance(10)  # the cache entry has expired
        leader = threading.Thread(target=lambda: client.resolve("web"))
        leader.start()
        wait_for(lambda: "web" in client._fetching, timeout=10, what="the first caller's refresh under way")
        assert client.resolve("web").port == 1  # stale, but an answer
        leader.join(30)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)


def test_a_first_resolve_against_a_hung_redis_fails_within_the_short_timeout(private_redis, settings):
    settings.DISCOVERY = {"REDIS_TIMEOUT": 0.5}
    client = DiscoveryClient(listen=False)
    private_redis.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(ServiceNotAvailable, match="unreachable"):
            client.resolve("web")
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    assert time.monotonic() - started < 10


def test_a_registry_restarted_empty_does_not_make_live_instances_vanish(private_redis, settings, clock, caplog):
    settings.DISCOVERY = {"SELF_PRESERVATION": 25}
    registry = ServiceRegistry(ttl=60)
    alive = registry.register("web", "127.0.0.1", 1)
    client = DiscoveryClient(listen=False, cache_ttl=5, clock=clock)
    assert client.resolve("web") == alive
    private_redis.stop()
    private_redis.start()  # no persistence: every record is gone until the next heartbeats
    wait_for(lambda: _answers(registry), timeout=20, what="Redis back")
    clock.advance(10)  # the cache entry expires: the next resolve asks the (empty) registry
    assert client.resolve("web") == alive  # self-preservation: it vanished without expiring or deregistering
    assert "vanished from the registry" in caplog.text

    # A genuine scale-down still converges at once: a deregistered instance leaves a tombstone.
    leaving = registry.register("web", "127.0.0.1", 2)
    clock.advance(10)
    assert {i.port for i in client.instances("web")} == {1, 2}
    registry.deregister(leaving)
    clock.advance(10)
    assert {i.port for i in client.instances("web")} == {1}
    # And the preserved one is given up after the grace period if it never comes back.
    clock.advance(20)
    with pytest.raises(ServiceNotAvailable):
        client.resolve("web")


def _answers(registry):
    try:
        return registry.instances("web") == []
    except Exception:  # noqa: BLE001 - not up yet
        return False


def test_an_instance_that_stops_heartbeating_is_expired_and_announced_on_time(registry, redis):
    import json

    pubsub = redis.pubsub()
    pubsub.subscribe("discovery:events")
    pubsub.get_message(timeout=5)  # subscribed
    client = DiscoveryClient()  # any process with a listening client sweeps (one sweeper at a time)
    assert client.wait_listening(10)
    silent = ServiceRegistry(ttl=1).register("quiet", "127.0.0.1", 1)
    deadline = silent.last_heartbeat + 1.0  # Redis server time
    expired = None
    until = time.monotonic() + 15
    while expired is None and time.monotonic() < until:
        message = pubsub.get_message(timeout=0.5)
        if message and message["type"] == "message" and json.loads(message["data"])["event"] == "expired":
            expired = json.loads(message["data"])
            seconds, micros = redis.time()
            late = seconds + micros / 1e6 - deadline
    client.close()
    assert expired is not None, "nobody touched the service, so its expiry was never noticed"
    assert expired["instance_id"] == silent.instance_id
    assert late < 3.0, late  # the sweep runs every second: noticed within about a second of the deadline


def _registry_through(proxy):
    """A registry on discovery's own short-timeout client, but through ``proxy``."""
    pool = registry_connection().connection_pool
    kwargs = {**pool.connection_kwargs, "host": "127.0.0.1", "port": proxy.port}
    return ServiceRegistry(redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs)))


def test_a_redis_frozen_past_the_ttl_does_not_leave_clients_with_no_instances(private_redis, settings, caplog):
    # Found by a user trial: after a SIGSTOP longer than the TTL, Redis's clock had passed every
    # deadline, so the sweep expired both live instances about a second after SIGCONT, and clients
    # answered "no instances are registered" until the registrars' back-off let them register again.
    # The registrars reach Redis through a proxy that stays shut a while after SIGCONT: their back-off
    # is what lasts past the expiry in the field, and without the proxy a busy machine decided the
    # race (they probe every second, and sometimes re-registered before the client looked).
    settings.DISCOVERY = {"TTL": 4, "HEARTBEAT_INTERVAL": 3, "REDIS_TIMEOUT": 0.5, "RETRY_BACKOFF_MAX": 3}
    caplog.set_level("INFO", logger="discovery_app")
    proxy = NetProxy(private_redis.port).start()
    registrars = [Registrar("web", "127.0.0.1", port, registry=_registry_through(proxy)).start(signals=())
                  for port in (1, 2)]
    client = DiscoveryClient()
    errors, resolved, stop = [], [], threading.Event()

    def caller():
        while not stop.is_set():
            try:
                resolved.append(client.resolve("web").port)
            except ServiceNotAvailable as exc:
                errors.append(exc)
            stop.wait(0.02)

    thread = threading.Thread(target=caller)
    try:
        assert client.wait_listening()
        wait_for(lambda: {i.port for i in client.instances("web")} == {1, 2}, timeout=10, what="both registered")
        thread.start()
        private_redis.process.send_signal(signal.SIGSTOP)
        wait_for(lambda: caplog.text.count("cannot reach the registry") >= 2, timeout=30, what="heartbeats failing")
        time.sleep(4 + 1.5)  # the freeze itself: longer than the TTL
        proxy.refuse()
        proxy.cut()
        private_redis.process.send_signal(signal.SIGCONT)
        wait_for(lambda: "expired right after the registry was unreachable" in caplog.text, timeout=30,
                 what="the client seeing both expire while their registrars still back off")
        seen = len(resolved)
        wait_for(lambda: len(resolved) > seen + 5, timeout=10, what="resolves while both are expired")
        proxy.heal()
        wait_for(lambda: "reachable again" in caplog.text and caplog.text.count("is registered") >= 2
                 and len(ServiceRegistry().instances("web")) == 2, timeout=30, what="both registrars back")
        seen = len(resolved)
        wait_for(lambda: len(resolved) > seen + 5, timeout=10, what="more resolves after the recovery")
    finally:
        stop.set()
        private_redis.process.send_signal(signal.SIGCONT)
        proxy.heal()
        if thread.is_alive():
            thread.join(30)
    assert errors == []
    assert set(resolved) == {1, 2}

    # An explicit deregistration (TERM) still removes an instance at once, right after an outage too.
    registrars[0].stop()
    wait_for(lambda: {i.port for i in client.instances("web")} == {2}, timeout=10, what="1 gone from the client")
    registrars[1].stop()
    client.close()
    proxy.stop()
