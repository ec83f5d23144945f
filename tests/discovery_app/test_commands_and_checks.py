import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from discovery_app.checks import check_discovery_settings
from discovery_app.registry import ServiceRegistry


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
    ({"HEARTBEAT_INTERVAL": 30}, ["discovery_app.E006"]),
    ({"HEARTBEAT_INTERVAL": 20}, ["discovery_app.W001"]),
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
