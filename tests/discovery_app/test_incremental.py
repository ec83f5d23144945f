"""Incremental refresh: a client that read a service fetches only what changed since, and still judges
health from heartbeats it does not re-read."""
import time

import pytest

from discovery_app import keys
from discovery_app.client import DiscoveryClient
from discovery_app.registry import ServiceRegistry
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


class SpyRegistry(ServiceRegistry):
    """The real registry, recording which kind of read reached Redis and what it carried."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def read(self, service):
        result = super().read(service)
        self.calls.append(("read", len(result.instances)))
        return result

    def read_changes(self, service, position, window, most=1000):
        result = super().read_changes(service, position, window, most)
        self.calls.append(("changes", None if result is None else (len(result.changed), len(result.aging))))
        return result


def ids(instances):
    return sorted(i.instance_id for i in instances)


def test_read_changes_returns_only_what_changed_since_a_position(redis):
    registry = ServiceRegistry()
    for n in range(50):
        registry.register("orders", "10.0.0.1", 8000 + n, instance_id=f"i{n:02}")
    first = registry.read("orders")
    assert len(first.instances) == 50 and first.position is not None

    assert registry.read_changes("orders", first.position, window=1).changed == {}
    for n in range(50):  # heartbeats are not changes
        registry.heartbeat(f"i{n:02}")
    nothing = registry.read_changes("orders", first.position, window=1)
    assert nothing.changed == {} and nothing.aging == {} and nothing.position == first.position

    registry.register("orders", "10.0.0.2", 9000, instance_id="new")
    registry.deregister("i07")
    registry.set_draining("orders", "i08")
    changes = registry.read_changes("orders", first.position, window=1)
    assert set(changes.changed) == {"new", "i07", "i08"}
    assert changes.changed["i07"] is None and changes.changed["new"].port == 9000
    assert changes.changed["i08"].draining
    # From the newer position, nothing more.
    assert registry.read_changes("orders", changes.position, window=1).changed == {}


def test_a_flush_a_trimmed_log_or_too_many_changes_ask_for_a_full_read(redis):
    registry = ServiceRegistry()
    registry.register("orders", "10.0.0.1", 8000, instance_id="one")
    position = registry.read("orders").position
    for n in range(5):
        registry.register("orders", "10.0.0.1", 9000 + n, instance_id=f"more{n}")
    assert registry.read_changes("orders", position, window=1, most=4) is None  # 5 changes > 4
    assert registry.read_changes("orders", position, window=1, most=5) is not None

    # Departures beyond the kept few hundred are trimmed: a position before them is too old.
    pipe = registry.pipeline("orders")
    for n in range(600):
        registry.register("orders", "10.0.0.3", 1000 + n, instance_id=f"short{n}", pipeline=pipe)
        registry.deregister(f"short{n}", pipeline=pipe)
    pipe.execute()
    assert registry.read_changes("orders", position, window=1, most=10_000) is None
    position = registry.read("orders").position
    assert registry.read_changes("orders", position, window=1) is not None

    redis.delete(*keys.service_keys("orders"))  # flushed (or restarted empty), then registered again
    registry.register("orders", "10.0.0.1", 8000, instance_id="one")
    assert registry.read_changes("orders", position, window=1) is None


def test_a_change_event_makes_the_client_fetch_only_the_change(redis):
    registry = ServiceRegistry()
    for n in range(200):
        registry.register("orders", "10.0.0.1", 8000 + n, instance_id=f"i{n:03}")
    spy = SpyRegistry()
    client = DiscoveryClient("round-robin", registry=spy)  # default TTL and CACHE_TTL
    try:
        client.wait_listening()
        assert len(client.instances("orders")) == 200
        assert spy.calls == [("read", 200)]
        registry.register("orders", "10.0.0.2", 9000, instance_id="zz-new")
        wait_for(lambda: "zz-new" in ids(client.instances("orders")), timeout=10, what="the new instance seen")
        registry.deregister("i000")
        wait_for(lambda: "i000" not in ids(client.instances("orders")), timeout=10, what="the departure seen")
        assert len(client.instances("orders")) == 200
        assert spy.calls[0] == ("read", 200)
        # Only the change, and no heartbeats: instances that beat on time are outside the window
        # (with a window as long as the TTL, every instance came back as "aging", i.e. everything).
        assert set(spy.calls[1:]) <= {("changes", (0, 0)), ("changes", (1, 0))}, spy.calls
    finally:
        client.close()


def test_health_is_still_judged_from_heartbeats_between_incremental_reads(redis, settings):
    # HEALTHY_FACTOR below 1: an instance that stops heartbeating is skipped before it expires,
    # although incremental reads do not re-read every heartbeat.
    settings.DISCOVERY = {"HEALTHY_FACTOR": 0.3}
    registry = ServiceRegistry(ttl=10)
    registry.register("orders", "10.0.0.1", 8000, instance_id="alive")
    registry.register("orders", "10.0.0.1", 8001, instance_id="silent")
    spy = SpyRegistry()
    client = DiscoveryClient("round-robin", registry=spy, cache_ttl=0.2, listen=False)
    try:
        assert ids(client.instances("orders")) == ["alive", "silent"]
        deadline = time.monotonic() + 30
        while "silent" in ids(client.instances("orders")):
            registry.heartbeat("alive")
            assert time.monotonic() < deadline, "the silent instance was never judged unhealthy"
            time.sleep(0.05)
        # Skipped as unhealthy (after 3 s) while still registered (its 10 s TTL had not run out), and
        # "alive", whose heartbeats were never re-read in full, is still healthy.
        assert "silent" in ids(registry.instances("orders"))
        assert ids(client.instances("orders")) == ["alive"]
        assert [kind for kind, _ in spy.calls].count("read") == 1 and len(spy.calls) > 3, spy.calls
    finally:
        client.close()
