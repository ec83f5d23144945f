import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from discovery_app.checks import check_discovery_settings
from discovery_app.registry import ServiceRegistry
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


def run(*args):
    out = io.StringIO()
    call_command("discover", *args, stdout=out, no_color=True)
    return out.getvalue()


def test_discover_lists_services_and_instances(registry):
    a = registry.register("orders", "10.0.0.1", 8000, {"zone": "a", "version": "2", "tags": ["blue"]})
    registry.register("orders", "10.0.0.2", 8000)
    registry.register("billing", "10.0.0.3", 9000)
    assert run() == "billing\t1 instance\norders\t2 instances\n"
    assert json.loads(run("--json")) == {"billing": 1, "orders": 2}
    table = run("orders")
    assert a.instance_id in table and "http://10.0.0.1:8000" in table and "healthy" in table and "tags=blue" in table
    data = json.loads(run("orders", "--json"))
    assert data["service"] == "orders" and len(data["instances"]) == 2
    row = next(row for row in data["instances"] if row["instance_id"] == a.instance_id)
    assert row["url"] == "http://10.0.0.1:8000" and row["zone"] == "a" and row["healthy"] is True and 0 <= row["heartbeat_age"] < 5


def test_discover_with_nothing_registered(redis):
    assert run() == "No service has a live instance.\n"
    assert run("orders") == "No live instance of orders.\n"


def test_discover_bad_input_and_unreachable_redis(redis, settings):
    with pytest.raises(CommandError, match="braces"):
        run("a{b}")
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    with pytest.raises(CommandError, match="cannot reach Redis"):
        run()


def ids_of(settings, value):
    settings.DISCOVERY = value
    return sorted(error.id for error in check_discovery_settings())


def test_checks_accept_the_defaults_and_a_sensible_config(settings):
    assert ids_of(settings, {}) == []
    assert ids_of(settings, {"TTL": 60, "HEARTBEAT_INTERVAL": 20, "ZONE": "eu-1", "STRATEGY": "round-robin",
                             "FALLBACKS": {"orders": ["http://10.0.0.5:8000"]}}) == []


@pytest.mark.parametrize("value, expected", [
    ([], ["discovery_app.E001"]),
    ({"TLL": 30}, ["discovery_app.E002"]),
    ({"TTL": 0}, ["discovery_app.E003"]),
    ({"BREAKER_FAILURES": 1.5}, ["discovery_app.E003"]),
    ({"STRATEGY": "fastest"}, ["discovery_app.E004"]),
    ({"FALLBACKS": {"orders": "http://x:1"}}, ["discovery_app.E005"]),
    ({"FALLBACKS": {"orders": ["ftp://x"]}}, ["discovery_app.E005"]),
    ({"FALLBACKS": {"orders": ["http://x:99999"]}}, ["discovery_app.E005"]),
    ({"FALLBACKS": {"orders": ["http://x:80a"]}}, ["discovery_app.E005"]),
    ({"FALLBACKS": {"orders": ["http://[::1:80"]}}, ["discovery_app.E005"]),  # unclosed IPv6 bracket
    ({"FALLBACKS": {"orders": ["http://user:secret@x:80"]}}, ["discovery_app.E005"]),
    ({"RETRY_READ_TIMEOUTS": "no"}, ["discovery_app.E010"]),
    ({"HTTP_DEADLINE": -1}, ["discovery_app.E010"]),
    ({"HEARTBEAT_INTERVAL": 30}, ["discovery_app.E006"]),
    ({"HEARTBEAT_INTERVAL": 20}, ["discovery_app.W001"]),
    ({"HEALTHY_FACTOR": 0.2}, ["discovery_app.W002"]),  # healthy for 6 s of every 10 s heartbeat interval
    ({"ZONE": 3}, ["discovery_app.E007"]),
    ({"KEY_PREFIX": "a{b"}, ["discovery_app.E008"]),
    ({"REDIS_ALIAS": "nope"}, ["discovery_app.E009"]),
])
def test_checks_reject_bad_settings(settings, value, expected):
    assert ids_of(settings, value) == expected


def test_settings_change_is_picked_up(registry, settings):
    settings.DISCOVERY = {"KEY_PREFIX": "sd", "TTL": 7}
    instance = ServiceRegistry().register("orders", "h", 1)
    assert instance.ttl == 7
    assert registry.connection.exists("sd:{orders}:instances") == 1


def test_a_fallback_keeps_its_base_path(registry):
    from discovery_app.client import DiscoveryClient

    client = DiscoveryClient(listen=False, fallbacks={"orders": ["http://gateway.internal/orders-api/"]})
    instance = client.resolve("orders")
    assert (instance.address, instance.port, instance.url) == ("gateway.internal", 80, "http://gateway.internal:80/orders-api")


def test_a_drain_survives_an_expiry_and_the_heartbeat_that_registers_the_instance_again(redis):
    # A flaky instance is what an operator drains; missing one TTL must not put it back in rotation.
    registry = ServiceRegistry(ttl=1)
    flaky = registry.register("orders", "10.0.0.1", 8000)
    assert registry.set_draining("orders", flaky.instance_id)
    wait_for(lambda: registry.instances("orders") == [], timeout=30, what="the instance expired")
    assert registry.heartbeat(flaky.instance_id) == "reregistered"
    [back] = registry.instances("orders")
    assert back.instance_id == flaky.instance_id and back.draining
    # A new process registering the id starts in rotation.
    registry.register("orders", "10.0.0.1", 8000, instance_id=flaky.instance_id)
    assert not registry.instances("orders")[0].draining


def test_drain_and_undrain_together_or_without_an_id_are_refused(registry):
    with pytest.raises(CommandError):
        call_command("discover", "orders", "--drain", "a", "--undrain", "a", stdout=io.StringIO())
    with pytest.raises(CommandError, match="need an instance id"):
        call_command("discover", "orders", "--drain", "", stdout=io.StringIO())


def test_discover_shows_an_instance_failing_its_health_check(registry):
    # A user trial: the registry marked the web tier failing (clients skipped it) and discover said healthy.
    instance = registry.register("orders", "10.0.0.1", 8000)
    registry.set_health("orders", instance.instance_id, failing=True)
    assert "failing its health check" in run("orders")
    [row] = json.loads(run("orders", "--json"))["instances"]
    assert row["failing"] is True and row["healthy"] is False


def test_an_operator_drains_an_instance_and_brings_it_back_without_restarting_it(registry, redis):
    import time as _time

    from discovery_app.client import DiscoveryClient
    from discovery_app.registrar import Registrar

    registrar = Registrar("orders", "10.0.0.1", 8000, interval=0.2).start(signals=())
    other = registry.register("orders", "10.0.0.2", 8000)
    client = DiscoveryClient(cache_ttl=3600)
    try:
        assert client.wait_listening(10)
        assert {client.resolve("orders").address for _ in range(40)} == {"10.0.0.1", "10.0.0.2"}
        out = io.StringIO()
        call_command("discover", "orders", "--drain", registrar.instance_id, stdout=out, no_color=True)
        assert "draining" in out.getvalue()
        wait_for(lambda: {client.resolve("orders").address for _ in range(40)} == {"10.0.0.2"}, timeout=10,
                 what="clients to stop picking the draining instance")
        _time.sleep(0.6)  # a few heartbeats: they do not undo the operator's decision
        assert {client.resolve("orders").address for _ in range(40)} == {"10.0.0.2"}
        assert "draining" in run("orders") and json.loads(run("orders", "--json"))["instances"][0]["draining"] in (True, False)
        call_command("discover", "orders", "--undrain", registrar.instance_id, stdout=io.StringIO())
        wait_for(lambda: {client.resolve("orders").address for _ in range(40)} == {"10.0.0.1", "10.0.0.2"}, timeout=10,
                 what="the instance back in rotation")
        registry.deregister(other)
        with pytest.raises(CommandError, match="not registered"):
            call_command("discover", "orders", "--drain", other.instance_id, stdout=io.StringIO())
    finally:
        client.close()
        registrar.stop()
