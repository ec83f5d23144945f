"""shoal_common.pubsub.Subscriber (the broadcast listener of every consumer and web process, the
discovery client's change listener) through the test proxy: a subscription whose connection goes dead
without a word (a blackhole: open, silent) is noticed and made again, so messages published after
the heal are heard. A quiet channel carries nothing to time out on, and redis-py's health-check PING
on a pub/sub connection is sent but its reply never awaited: without its own PING the thread stayed
subscribed to a dead connection for good.

    nice -n 10 .venv/bin/pytest -s tests/network/test_subscriber.py  # prints the recovery time
"""
import itertools
import time

from shoal_common.pubsub import Subscriber
from tests.waiting import wait_for

RECOVERY_BOUND = 15  # seconds after the heal (docs/consuming.md)
FAULT = 10  # seconds of blackhole


def test_a_subscriber_hears_again_after_a_blackhole(net_proxy, redis):
    heard = []
    subscriber = Subscriber("news", lambda: net_proxy.client(health_check_interval=30), heard.append,
                            name="news listener", backoff_max=5.0)
    subscriber.start()
    try:
        wait_for(subscriber.subscribed.is_set, timeout=10, what="subscribed")
        wait_for(lambda: redis.publish("news", "before") and "before" in heard, timeout=10, what="a message heard")

        net_proxy.blackhole()
        time.sleep(FAULT)  # the fault itself is what is under test
        net_proxy.heal()
        healed = time.monotonic()
        counter = itertools.count()
        # At most once: the test publishes until one message is heard (each poll publishes one more).
        wait_for(lambda: redis.publish("news", f"after-{next(counter)}") is not None
                 and any(h.startswith("after-") for h in heard),
                 timeout=RECOVERY_BOUND, interval=0.2,
                 what=f"a message published after the heal heard within {RECOVERY_BOUND} s of it")
        print(f"subscriber heard again {time.monotonic() - healed:.1f} s after the heal")
    finally:
        subscriber.stop(timeout=10)
    assert not subscriber.is_alive()
