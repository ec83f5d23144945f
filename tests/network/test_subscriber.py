"""shoal_common.pubsub.Subscriber (the broadcast and discovery listeners) on a quiet channel: the PING
that checks a quiet subscription is answered on one server and on a cluster, and a subscription whose
path died silently (a blackhole: open, nothing delivered) is made again once the network heals."""
import threading
import time

import pytest

from shoal_common.pubsub import Subscriber
from streams_app.redis.connection import get_connection
from tests.waiting import wait_for


class Quick(Subscriber):
    QUIET_SECONDS = 0.3
    ANSWER_SECONDS = 2.0
    POLL_SECONDS = 0.1


@pytest.fixture
def subscriber():
    started = []

    def start(connect):
        received, subscriptions = [], []
        thread = Quick("subscriber-test", connect, received.append, name="subscriber-test",
                       on_subscribed=lambda: subscriptions.append(time.monotonic()), backoff_max=1.0)
        thread.received, thread.subscriptions = received, subscriptions
        thread.start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stop(5)


@pytest.mark.both_redis
def test_a_quiet_subscription_is_pinged_and_kept(redis, subscriber):
    listener = subscriber(get_connection)
    wait_for(listener.subscribed.is_set, timeout=10, what="subscribed")
    time.sleep(3 * Quick.ANSWER_SECONDS)  # quiet for long enough to be pinged several times: what is under test
    assert len(listener.subscriptions) == 1 and listener.failures == 0
    redis.publish("subscriber-test", "still here")
    wait_for(lambda: listener.received == [b"still here"], timeout=5, what="the message")


def test_a_subscription_that_died_silently_is_made_again_after_the_heal(redis, net_proxy, subscriber):
    connections = threading.local()

    def connect():  # a client of its own per subscription, as the listeners make theirs
        connections.client = net_proxy.client(decode_responses=False, socket_timeout=5)
        return connections.client

    listener = subscriber(connect)
    wait_for(listener.subscribed.is_set, timeout=10, what="subscribed")
    net_proxy.blackhole()
    wait_for(lambda: not listener.subscribed.is_set(), timeout=10, what="the dead subscription noticed")
    net_proxy.heal()
    wait_for(lambda: len(listener.subscriptions) == 2 and listener.subscribed.is_set(), timeout=10,
             what="subscribed again after the heal")
    redis.publish("subscriber-test", "after the heal")
    wait_for(lambda: listener.received == [b"after the heal"], timeout=5, what="the message")
