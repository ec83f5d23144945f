"""Broadcast through a real Redis to a listener thread in this process."""
import logging

import pytest
from django.core.management import CommandError, call_command

from streams_app import broadcast as bc
from streams_app.exceptions import BroadcastError
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


@pytest.fixture
def listener(redis):
    started = bc.Listener()
    started.start()
    assert started.subscribed.wait(10)
    yield started
    started.stop(timeout=5)


@pytest.fixture
def received():
    got = []
    bc.on_broadcast("test.event")(got.append)
    yield got
    bc._handlers.pop("test.event", None)


def test_a_handler_receives_the_data(listener, received, redis):
    assert bc.broadcast("test.event", {"n": 1}) == 1
    wait_for(lambda: received == [{"n": 1}], what="the broadcast handled")


def test_a_failing_handler_and_a_foreign_message_do_not_stop_the_listener(listener, received, redis):
    bc.on_broadcast("test.event")(lambda data: 1 / 0)
    redis.publish("shoal:broadcast", "not json at all")
    bc.broadcast("test.event", "after")
    wait_for(lambda: received == ["after"], what="the later broadcast handled")
    assert listener.is_alive()


def test_log_level_broadcast_changes_shoal_loggers(listener, redis):
    logger = logging.getLogger("streams_app")
    before = logger.level
    try:
        bc.broadcast("log_level", {"level": "debug"})
        wait_for(lambda: logger.level == logging.DEBUG, what="streams_app logger at DEBUG")
        assert logging.getLogger("discovery_app").level == logging.DEBUG
    finally:
        logger.setLevel(before)
        logging.getLogger("discovery_app").setLevel(before)
        logging.getLogger("demo").setLevel(before)


def test_the_listener_resubscribes_after_redis_restarts(redis_factory, use_redis, received):
    server = redis_factory()
    use_redis(server)
    listener = bc.Listener()
    listener.start()
    try:
        assert listener.subscribed.wait(10)
        server.restart()
        wait_for(lambda: server.client().pubsub_numsub("shoal:broadcast")[0][1] == 1, timeout=20, what="resubscribed")
        bc.broadcast("test.event", "back")
        wait_for(lambda: received == ["back"], what="a broadcast after the restart")
    finally:
        listener.stop(timeout=5)


def test_bad_input_is_refused():
    with pytest.raises(BroadcastError, match="non-empty"):
        bc.broadcast("", {})
    with pytest.raises(BroadcastError, match="JSON"):
        bc.broadcast("x", {"when": object()})
    with pytest.raises(CommandError, match="JSON is not valid"):
        call_command("broadcast", "log_level", "{level")


def test_discovery_invalidate_broadcast_drops_every_client_cache(listener, redis):
    from discovery_app.client import DiscoveryClient
    from discovery_app.registry import ServiceRegistry

    registry = ServiceRegistry()
    registry.register("orders", "127.0.0.1", 9001, instance_id="one")
    # No change events and an hour-long cache: only the broadcast can make the client look again.
    client = DiscoveryClient("round-robin", listen=False, cache_ttl=3600)
    assert {i.instance_id for i in client.instances("orders")} == {"one"}
    registry.register("orders", "127.0.0.1", 9002, instance_id="two")
    assert {i.instance_id for i in client.instances("orders")} == {"one"}
    bc.broadcast("discovery.invalidate", {"service": "orders"})
    wait_for(lambda: {i.instance_id for i in client.instances("orders")} == {"one", "two"},
             what="the client to see the new instance after the broadcast")
