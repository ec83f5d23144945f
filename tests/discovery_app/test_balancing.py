"""Strategies, zone preference, breakers and panic mode, over instances in a real Redis."""
import logging
import random
from collections import Counter

import pytest

from discovery_app.balancers import STRATEGIES
from discovery_app.breaker import CLOSED, HALF_OPEN, OPEN, Breakers
from discovery_app.client import DiscoveryClient
from discovery_app.exceptions import ServiceNotAvailable


def make_client(strategy, **kwargs):
    kwargs.setdefault("listen", False)
    return DiscoveryClient(strategy=strategy, rng=random.Random(7), **kwargs)


@pytest.fixture
def three(registry):
    return [registry.register("orders", "127.0.0.1", 9000 + n, {"zone": "a" if n < 2 else "b"}) for n in range(3)]


def test_round_robin_is_exact(three):
    client = make_client("round-robin")
    picks = [client.resolve("orders").instance_id for _ in range(300)]
    assert Counter(picks) == {i.instance_id: 100 for i in three}
    assert picks[:3] == picks[3:6] == sorted(i.instance_id for i in three)


def test_weighted_random_follows_weights(registry):
    light = registry.register("orders", "h", 1, {"weight": 1})
    heavy = registry.register("orders", "h", 2, {"weight": 3})
    drained = registry.register("orders", "h", 3, {"weight": 0})
    client = make_client("weighted-random")
    picks = Counter(client.resolve("orders").instance_id for _ in range(8000))
    assert picks[drained.instance_id] == 0
    assert abs(picks[heavy.instance_id] / 8000 - 0.75) < 0.03
    assert picks[light.instance_id] + picks[heavy.instance_id] == 8000


def test_random_uses_every_instance(three):
    client = make_client("random")
    assert set(client.resolve("orders").instance_id for _ in range(200)) == {i.instance_id for i in three}


@pytest.mark.parametrize("strategy", ["least-connections", "power-of-two-choices"])
def test_load_aware_strategies_avoid_the_busy_instance(three, strategy):
    client = make_client(strategy)
    busy = three[0]
    with client.track(busy), client.track(busy):
        picks = Counter(client.resolve("orders").instance_id for _ in range(300))
        assert client.inflight(busy) == 2
    assert picks[busy.instance_id] == 0
    assert set(picks) == {three[1].instance_id, three[2].instance_id}  # ties are spread, not piled
    assert client.inflight(busy) == 0


def test_least_connections_prefers_the_idle_one_of_busy_instances(three):
    client = make_client("least-connections")
    with client.track(three[0]), client.track(three[0]), client.track(three[1]), client.track(three[2]), client.track(three[2]):
        assert {client.resolve("orders").instance_id for _ in range(50)} == {three[1].instance_id}


def test_zone_preference_while_the_zone_has_a_healthy_instance(three, clock):
    client = make_client("round-robin", zone="b", breaker_failures=1, clock=clock)
    assert {client.resolve("orders").instance_id for _ in range(10)} == {three[2].instance_id}
    client.report(three[2], ok=False)  # zone b's only instance is ejected: use zone a
    assert {client.resolve("orders").instance_id for _ in range(10)} == {three[0].instance_id, three[1].instance_id}


def test_breaker_ejects_after_n_failures_and_lets_one_trial_through_after_cooldown(three, clock):
    client = make_client("round-robin", breaker_failures=3, breaker_cooldown=30, clock=clock)
    dead = three[0]
    for _ in range(2):
        client.report(dead, ok=False)
    assert dead.instance_id in {client.resolve("orders").instance_id for _ in range(3)}
    client.report(dead, ok=False)
    assert client.breakers.state(dead.instance_id) == OPEN
    assert dead.instance_id not in {client.resolve("orders").instance_id for _ in range(30)}
    clock.advance(30)
    assert client.breakers.state(dead.instance_id) == HALF_OPEN
    picks = [client.resolve("orders").instance_id for _ in range(30)]
    assert picks.count(dead.instance_id) == 1  # exactly one trial call
    client.report(dead, ok=False)  # the trial failed: another full cool-down
    clock.advance(29)
    assert dead.instance_id not in {client.resolve("orders").instance_id for _ in range(30)}
    clock.advance(1)
    assert dead.instance_id in {client.resolve("orders").instance_id for _ in range(3)}
    client.report(dead, ok=True)
    assert client.breakers.state(dead.instance_id) == CLOSED


def test_panic_mode_uses_every_instance_when_all_breakers_are_open(three, clock, caplog):
    client = make_client("round-robin", breaker_failures=1, clock=clock)
    for instance in three:
        client.report(instance, ok=False)
    with caplog.at_level(logging.WARNING, logger="discovery_app"):
        picks = {client.resolve("orders").instance_id for _ in range(6)}
    assert picks == {i.instance_id for i in three}
    assert sum("panic" in r.getMessage() for r in caplog.records) == 1  # once per episode, not per call


def test_no_instances_uses_fallbacks_then_says_why(registry):
    client = make_client("round-robin", fallbacks={"orders": ["http://10.0.0.5:8000", "https://b.example"]})
    assert {client.resolve_url("orders") for _ in range(4)} == {"http://10.0.0.5:8000", "https://b.example:443"}
    with pytest.raises(ServiceNotAvailable, match="'billing' is not available: no instances") as err:
        client.resolve("billing")
    assert err.value.service == "billing" and err.value.reason == ServiceNotAvailable.NO_INSTANCES


def test_all_unhealthy_is_reported_as_such(registry, settings):
    registry.register("orders", "h", 1)
    settings.DISCOVERY = {"HEALTHY_FACTOR": 0.001}  # 30 ms of heartbeat age counts as unhealthy
    client = make_client("round-robin")
    from tests.waiting import wait_for

    def unhealthy():
        try:
            client.invalidate("orders")
            client.resolve("orders")
        except ServiceNotAvailable as exc:
            return exc
    exc = wait_for(unhealthy, what="the instance to look unhealthy")
    assert exc.reason == ServiceNotAvailable.ALL_UNHEALTHY


def test_breaker_ignores_stragglers_while_open():
    breakers = Breakers(failures=2, cooldown=10, clock=lambda: 0.0)
    assert not breakers.failure("x", now=0) and breakers.failure("x", now=0)
    assert not breakers.failure("x", now=5)  # a call that was in flight when it opened
    assert breakers.state("x", now=9.9) == OPEN and breakers.state("x", now=10) == HALF_OPEN
    assert breakers.acquire("x", now=10) and not breakers.acquire("x", now=11)
    assert breakers.acquire("x", now=20)  # the trial never reported back: hand out another


def test_every_strategy_is_registered_by_name():
    assert set(STRATEGIES) == {"round-robin", "random", "weighted-random", "least-connections", "power-of-two-choices"}
    with pytest.raises(ValueError, match="unknown strategy"):
        DiscoveryClient(strategy="fastest")


def test_round_robin_stays_exact_across_threads(three):
    import threading

    client = make_client("round-robin")
    picks, lock = Counter(), threading.Lock()

    def worker():
        local = Counter(client.resolve("orders").instance_id for _ in range(300))
        with lock:
            picks.update(local)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert picks == {i.instance_id: 400 for i in three}
