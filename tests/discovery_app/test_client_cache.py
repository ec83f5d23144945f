"""The client's cache: change events drop it at once; with Redis down it serves stale instances."""
import logging
import threading

import pytest

from discovery_app.client import DiscoveryClient
from discovery_app.exceptions import ServiceNotAvailable
from discovery_app.registry import ServiceRegistry
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


@pytest.fixture
def client_factory():
    clients = []

    def make(**kwargs):
        client = DiscoveryClient(strategy="round-robin", **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def ids(instances):
    return sorted(i.instance_id for i in instances)


def test_without_events_the_cache_holds_for_its_ttl(registry, client_factory):
    first = registry.register("orders", "h", 1)
    client = client_factory(listen=False, cache_ttl=3600)
    assert ids(client.instances("orders")) == [first.instance_id]
    registry.register("orders", "h", 2)
    assert ids(client.instances("orders")) == [first.instance_id]  # what the event test below beats
    client.invalidate("orders")
    assert len(client.instances("orders")) == 2


def test_registration_and_deregistration_reach_the_client_by_pubsub(registry, client_factory):
    first = registry.register("orders", "h", 1)
    client = client_factory(cache_ttl=3600)
    assert client.wait_listening(timeout=10)
    assert ids(client.instances("orders")) == [first.instance_id]
    second = ServiceRegistry().register("orders", "h", 2)
    wait_for(lambda: len(client.instances("orders")) == 2, timeout=5, what="the new instance to be seen")
    ServiceRegistry().deregister(second)
    wait_for(lambda: ids(client.instances("orders")) == [first.instance_id], timeout=5, what="the deregistration")


def test_expiry_reaches_the_client_by_pubsub(redis, client_factory):
    registry = ServiceRegistry(ttl=0.5)
    short = registry.register("orders", "h", 1)
    keeper = ServiceRegistry().register("orders", "h", 2)
    client = client_factory(cache_ttl=3600)
    assert client.wait_listening(timeout=10)
    assert ids(client.instances("orders")) == sorted([short.instance_id, keeper.instance_id])
    # Someone reading the registry prunes the silent instance and publishes "expired".
    wait_for(lambda: len(ServiceRegistry().instances("orders")) == 1, timeout=5, what="expiry")
    wait_for(lambda: ids(client.instances("orders")) == [keeper.instance_id], timeout=5, what="the client to drop it")


def test_redis_down_serves_stale_instances_and_says_so(redis_factory, use_redis, client_factory, caplog):
    server = redis_factory()
    use_redis(server)
    instance = ServiceRegistry().register("orders", "h", 1)
    client = client_factory(listen=False, cache_ttl=0.0001, fallbacks={"billing": ["http://10.9.9.9:80"]})
    assert client.resolve("orders") == instance
    server.stop()
    with caplog.at_level(logging.WARNING, logger="discovery_app"):
        for _ in range(5):
            assert client.resolve("orders").instance_id == instance.instance_id
    stale_lines = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(stale_lines) == 1 and "orders" in stale_lines[0] and "last known" in stale_lines[0]
    assert client.resolve_url("billing") == "http://10.9.9.9:80"
    with pytest.raises(ServiceNotAvailable, match="registry is unreachable") as err:
        client.resolve("shipping")
    assert err.value.reason == ServiceNotAvailable.REGISTRY_UNREACHABLE


def test_the_stale_warning_is_logged_once_per_outage_by_threads_retrying_it(redis_factory, use_redis, client_factory,
                                                                          caplog, settings):
    # A user trial: 5 warnings in a 20 s outage with 4 threads, one per back-off retry, where the docs
    # promise one when it starts (and one "back to normal" when it ends).
    settings.DISCOVERY = {"RETRY_BACKOFF_MAX": 0.1}
    server = redis_factory()
    use_redis(server)
    instance = ServiceRegistry().register("orders", "h", 1)
    client = client_factory(listen=False, cache_ttl=0.0001)
    client.resolve("orders")
    server.stop()
    stopping = threading.Event()
    answers = []

    def caller():
        while not stopping.is_set():
            answers.append(client.resolve("orders").instance_id)

    with caplog.at_level(logging.INFO, logger="discovery_app"):
        threads = [threading.Thread(target=caller) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: client._failures >= 10, timeout=30, what="ten back-off retries of the registry")
        finally:
            stopping.set()
            for thread in threads:
                thread.join(10)
        during = [r.getMessage() for r in caplog.records]
        server.start()
        fresh = ServiceRegistry().register("orders", "h", 2)
        wait_for(lambda: client.resolve("orders").instance_id in (fresh.instance_id, instance.instance_id)
                 and client._failures == 0, timeout=15, what="the registry read again")
    assert set(answers) == {instance.instance_id}
    assert len([m for m in during if "unreachable" in m]) == 1, during
    assert not [m for m in during if "back to normal" in m], during
    assert len([r for r in caplog.records if "back to normal" in r.getMessage()]) == 1


def test_with_redis_down_at_start_the_listening_client_uses_its_fallbacks_and_listens_once_redis_is_up(
        redis_factory, use_redis, client_factory, http_service, caplog):
    # A user trial: with LISTEN on (the default), starting the change listener raised redis's raw
    # ConnectionError from resolve(), resolve_url() and request(); the FALLBACKS were never used.
    fallback = http_service("fallback")
    server = redis_factory()
    use_redis(server)
    server.stop()
    client = client_factory(fallbacks={"billing": [f"http://127.0.0.1:{fallback.port}"]})
    assert client.listen
    assert client.resolve_url("billing") == f"http://127.0.0.1:{fallback.port}"
    assert client.request("billing", "POST", "/invoices").text == "fallback /invoices"
    with pytest.raises(ServiceNotAvailable, match="registry is unreachable") as err:
        client.resolve("shipping")
    assert err.value.reason == ServiceNotAvailable.REGISTRY_UNREACHABLE
    # Redis back: the listener starts with the next call after the back-off, and events flow again.
    server.start()
    instance = ServiceRegistry().register("shipping", "h", 1)
    wait_for(lambda: _resolves(client, "shipping") == instance.instance_id, timeout=15,
             what="the registry read again after the back-off")
    assert client.wait_listening(timeout=10)
    second = ServiceRegistry().register("shipping", "h", 2)
    wait_for(lambda: len(client.instances("shipping")) == 2, timeout=10, what="a registration event")
    assert second.instance_id in ids(client.instances("shipping"))


def _resolves(client, service):
    try:
        return client.resolve(service).instance_id
    except ServiceNotAvailable:
        return None


def test_client_recovers_when_redis_comes_back(redis_factory, use_redis, client_factory, caplog):
    server = redis_factory()
    use_redis(server)
    ServiceRegistry().register("orders", "h", 1)
    client = client_factory(listen=False, cache_ttl=0.0001)
    client.resolve("orders")
    server.stop()
    client.resolve("orders")  # stale
    server.start()  # a fresh, empty Redis
    fresh = ServiceRegistry().register("orders", "h", 2)
    with caplog.at_level(logging.INFO, logger="discovery_app"):
        wait_for(lambda: client.resolve("orders").instance_id == fresh.instance_id, timeout=15,
                 what="the client to read the registry again after its back-off")
    assert any("back to normal" in r.getMessage() for r in caplog.records)


def test_listener_survives_a_redis_restart_and_refreshes_what_it_may_have_missed(redis_factory, use_redis, client_factory,
                                                                                 settings):
    settings.DISCOVERY = {"SELF_PRESERVATION": 0}  # about the listener: the old instance may go at once
    server = redis_factory()
    use_redis(server)
    old = ServiceRegistry().register("orders", "h", 1)
    client = client_factory(cache_ttl=3600)
    assert client.wait_listening(timeout=10)
    assert ids(client.instances("orders")) == [old.instance_id]
    server.stop()
    wait_for(lambda: not client._hub.listener.ready.is_set(), timeout=10, what="the listener to notice the outage")
    server.start()  # empty: whatever happened meanwhile was never announced to this client
    new = ServiceRegistry().register("orders", "h", 2)
    assert client.wait_listening(timeout=15)
    wait_for(lambda: ids(client.instances("orders")) == [new.instance_id], timeout=10,
             what="the client to drop the entry it could not have been told about")


def test_an_invalidation_during_a_fetch_is_not_lost(redis):
    from discovery_app.client import DiscoveryClient
    from discovery_app.registry import ServiceRegistry

    registry = ServiceRegistry()
    registry.register("orders", "127.0.0.1", 9001, instance_id="one")
    client = DiscoveryClient("round-robin", listen=False, cache_ttl=3600)
    read = client.registry.read

    def read_then_change(service):
        # The read has reached the registry; a change and its event land before it is cached.
        result = read(service)
        registry.register("orders", "127.0.0.1", 9002, instance_id="two")
        client.invalidate("orders")
        return result

    client.registry.read = read_then_change
    assert {i.instance_id for i in client.instances("orders")} == {"one"}
    client.registry.read = read
    assert {i.instance_id for i in client.instances("orders")} == {"one", "two"}
