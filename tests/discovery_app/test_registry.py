import json
import os

import pytest
from redis.crc import key_slot

from discovery_app import keys
from discovery_app.exceptions import InvalidRegistration, UnknownInstance
from discovery_app.registry import ServiceRegistry
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


def server_ms(redis):
    seconds, micros = redis.time()
    return seconds * 1000 + micros // 1000


def events(pubsub):
    out = []
    while (message := pubsub.get_message(timeout=0.2)) is not None:
        if message["type"] == "message":
            out.append(json.loads(message["data"]))
    return out


@pytest.fixture
def pubsub(redis):
    ps = redis.pubsub()
    ps.subscribe(keys.events_channel())
    ps.get_message(timeout=1)
    yield ps
    ps.close()


def test_register_records_metadata_and_server_timestamps(registry, redis):
    instance = registry.register("orders", "10.0.0.1", 8000,
                                 {"version": "2.1", "zone": "a", "weight": 3, "tags": ["blue"], "owner": "team"})
    [found] = registry.instances("orders")
    assert found == instance
    assert (found.version, found.zone, found.weight, found.tags, found.extra) == ("2.1", "a", 3.0, ("blue",), {"owner": "team"})
    server_now = float(redis.time()[0])
    assert abs(found.registered_at - server_now) < 5 and found.last_heartbeat == found.registered_at
    assert found.url == "http://10.0.0.1:8000" and found.ttl == 30.0
    assert instance.instance_id.startswith("orders-")
    assert registry.services() == ["orders"]


def test_all_keys_of_a_service_share_one_hash_slot():
    assert len({key_slot(key.encode()) for key in keys.service_keys("orders")}) == 1
    assert keys.records_key("orders") == "discovery:{orders}:instances"


def test_silent_instance_expires_and_leaves_no_dangling_index(redis, pubsub):
    registry = ServiceRegistry(ttl=0.3)
    instance = registry.register("orders", "h", 1)
    events(pubsub)
    wait_for(lambda: registry.instances("orders") == [], timeout=5, what="the silent instance to expire")
    assert redis.hlen(keys.records_key("orders")) == 0
    assert redis.zcard(keys.deadlines_key("orders")) == 0
    assert {"event": "expired", "service": "orders", "instance_id": instance.instance_id} in events(pubsub)
    assert registry.services() == []
    assert redis.smembers(keys.services_key()) == set()


def test_heartbeat_moves_the_deadline(redis):
    registry = ServiceRegistry(ttl=5)
    instance = registry.register("orders", "h", 1)
    first = redis.zscore(keys.deadlines_key("orders"), instance.instance_id)
    wait_for(lambda: server_ms(redis) > first - 5000 + 20, what="the server clock to move on")
    assert registry.heartbeat(instance.instance_id) == "alive"
    assert redis.zscore(keys.deadlines_key("orders"), instance.instance_id) > first
    [found] = registry.instances("orders")
    assert found.last_heartbeat > found.registered_at == instance.registered_at


def test_heartbeat_after_flushall_reregisters_the_full_record(registry, redis, pubsub):
    instance = registry.register("orders", "10.0.0.1", 8000, {"zone": "a", "tags": ["x"]})
    redis.flushall()
    assert registry.instances("orders") == []
    events(pubsub)
    assert registry.heartbeat(instance.instance_id) == "reregistered"
    [found] = registry.instances("orders")
    assert (found.address, found.port, found.zone, found.tags) == ("10.0.0.1", 8000, "a", ("x",))
    assert found.registered_at == instance.registered_at
    assert registry.services() == ["orders"]
    assert [e["event"] for e in events(pubsub)] == ["reregistered"]


def test_deregister_publishes_and_a_late_heartbeat_does_not_resurrect(registry, redis, pubsub):
    instance = registry.register("orders", "h", 1)
    other = ServiceRegistry()  # e.g. the admin: it knows the instance only from instances()
    [listed] = other.instances("orders")
    events(pubsub)
    assert other.deregister(listed) is True
    assert registry.instances("orders") == []
    assert events(pubsub) == [{"event": "deregistered", "service": "orders", "instance_id": instance.instance_id}]
    assert registry.heartbeat(instance.instance_id) == "deregistered"
    assert registry.instances("orders") == []
    # An explicit register() of the same id is a new decision and wins over the tombstone.
    registry.register("orders", "h", 1, instance_id=instance.instance_id)
    assert [i.instance_id for i in registry.instances("orders")] == [instance.instance_id]


def test_writers_accept_a_pipeline(registry):
    a = registry.register("orders", "h", 1)
    b = registry.register("orders", "h", 2)
    pipe = registry.pipeline("orders")
    registry.heartbeat(a.instance_id, pipeline=pipe)
    registry.deregister(b.instance_id, pipeline=pipe)
    assert [i.instance_id for i in registry.instances("orders")] == sorted([a.instance_id, b.instance_id])
    pipe.execute()
    assert [i.instance_id for i in registry.instances("orders")] == [a.instance_id]


def test_lists_every_service_for_an_admin(registry):
    registry.register("orders", "h", 1)
    registry.register("orders", "h", 2)
    registry.register("billing", "h", 3)
    assert registry.services() == ["billing", "orders"]
    assert {name: len(found) for name, found in registry.all_instances().items()} == {"billing": 1, "orders": 2}


@pytest.mark.parametrize("args, message", [
    (("", "h", 1), "non-empty"),
    (("a{b}", "h", 1), "braces"),
    (("orders", "", 1), "address"),
    (("orders", "h", 0), "port"),
    (("orders", "h", "80"), "port"),
    (("orders", "h", 1, {"weight": -1}), "weight"),
    (("orders", "h", 1, {"tags": "blue"}), "tags"),
])
def test_bad_registrations_say_what_is_wrong(registry, args, message):
    with pytest.raises(InvalidRegistration, match=message):
        registry.register(*args)


def test_heartbeat_of_an_unknown_id_says_how_to_fix_it(registry):
    with pytest.raises(UnknownInstance, match="register"):
        registry.heartbeat("nobody")
    with pytest.raises(UnknownInstance, match="service="):
        registry.deregister("nobody")


def test_unreadable_record_is_skipped_not_fatal(registry, redis):
    registry.register("orders", "h", 1)
    redis.hset(keys.records_key("orders"), "junk", "not json")
    redis.zadd(keys.deadlines_key("orders"), {"junk": 2**50})
    assert len(registry.instances("orders")) == 1


def test_pid_is_in_generated_ids(registry):
    assert f"-{os.getpid()}-" in registry.register("orders", "h", 1).instance_id


@pytest.mark.parametrize("metadata, address", [
    ({"weight": float("nan")}, "10.0.0.1"),
    ({"weight": float("inf")}, "10.0.0.1"),
    ({}, "not a host!"),
    ({}, "host_with_underscore..example"),
    ({}, "-leading.example"),
])
def test_unregistrable_values_are_refused_before_redis(registry, metadata, address):
    with pytest.raises(InvalidRegistration):
        registry.register("orders", address, 80, metadata)
    assert registry.instances("orders") == []


@pytest.mark.parametrize("address", ["10.0.0.1", "::1", "fe80::1", "orders-1.eu.internal", "localhost", "ORDERS"])
def test_host_names_and_ips_are_accepted(registry, address):
    assert registry.register("orders", address, 80).address == address


def test_a_registrar_whose_interval_is_not_below_its_ttl_is_refused(redis):
    from discovery_app.registrar import Registrar

    with pytest.raises(InvalidRegistration, match="interval"):
        Registrar("orders", "h", 1, interval=30, ttl=30)


def test_metadata_comes_back_exactly_as_given(registry, redis):
    metadata = {"big": 12345678901234567, "empty_list": [], "empty_map": {}, "pi": 3.141592653589793,
                "tiny": 1e-300, "nested": {"list": [1, 2.5, "x", None, True]}, "text": "é\u2603"}
    instance = registry.register("orders", "h", 1, {**metadata, "tags": []})
    [found] = registry.instances("orders")
    assert found.extra == metadata and found.tags == ()
    assert registry.heartbeat(instance.instance_id) == "alive"
    [found] = registry.instances("orders")
    assert found.extra == metadata
    redis.delete(keys.records_key("orders"))  # lost: the next heartbeat writes it again
    assert registry.heartbeat(instance.instance_id) == "reregistered"
    [found] = registry.instances("orders")
    assert found.extra == metadata and found.last_heartbeat >= instance.last_heartbeat


def test_registry_calls_use_the_short_timeout_on_a_client_of_the_right_kind(redis, settings):
    # On a cluster the short-timeout client must be a cluster client too: a plain client on one
    # node would meet MOVED for most services.
    from discovery_app.connection import get_connection
    from shoal_common.redisconn import is_cluster

    settings.DISCOVERY = {"REDIS_TIMEOUT": 0.75}
    conn = ServiceRegistry().connection
    assert is_cluster(conn) == is_cluster(get_connection())
    kwargs = conn.get_connection_kwargs() if is_cluster(conn) else conn.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.75


def test_the_sweep_expires_silent_instances_of_every_service(redis, pubsub):
    # Services in several slots (on a cluster, on several masters): the sweep's scripts run on
    # one pipeline per node there, as a cluster pipeline refuses scripts.
    names = ["orders", "billing", "web", "search", "mail", "auth"]
    registry = ServiceRegistry(ttl=1)
    deadline = max(registry.register(name, "h", 1).last_heartbeat for name in names) * 1000 + 1000
    wait_for(lambda: server_ms(redis) > deadline, timeout=15, what="the instances' deadline")
    assert registry.sweep(period=0.001) == len(names)
    assert all(redis.hlen(keys.records_key(name)) == 0 for name in names)
    assert sorted(e["service"] for e in events(pubsub) if e["event"] == "expired") == sorted(names)
    assert registry.services() == []
