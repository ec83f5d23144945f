"""A daemon thread that stays subscribed to one pub/sub channel through Redis outages.

It makes its connection inside the thread (nothing made in a pre-fork master is shared), hands each
message's data to ``on_message``, and after a lost subscription resubscribes with back-off and calls
``on_subscribed`` again: pub/sub is at most once, so a user that caches (the discovery client) drops
what it may have missed then. A failing ``on_message`` is logged and the thread goes on.

While subscribed it polls every ``POLL_SECONDS``; after each poll ``tick()`` runs (periodic work that
must share the thread, e.g. discovery's expiry sweep), and ``idle()`` returning True ends the thread
(nobody listens any more).

A quiet channel carries nothing that could time out, so a connection that died without a word (a NAT
or load-balancer drop, a half-open link) would leave the thread subscribed to nothing for good: redis-py's
health-check PING on a pub/sub connection is sent, but its reply is never awaited. So after
``ALIVE_SECONDS`` without hearing anything the thread PINGs, and a PING unanswered for as long counts
as a lost subscription (tests/network/test_subscriber.py).
"""
import logging
import threading
import time

import redis

from shoal_common.backoff import backoff_delay
from shoal_common.connections import TRANSIENT_ERRORS

logger = logging.getLogger("shoal_common.pubsub")


class Subscriber(threading.Thread):
    POLL_SECONDS = 1.0
    ALIVE_SECONDS = 3.0

    def __init__(self, channel, connect, on_message, *, name, on_subscribed=None, backoff_max=5.0, log=None,
                 tick=None, idle=None):
        super().__init__(name=name, daemon=True)
        self.tick = tick
        self.idle = idle
        self.channel = channel
        self.connect = connect  # () -> a redis client; called in this thread, once per (re)subscription
        self.on_message = on_message
        self.on_subscribed = on_subscribed
        self.backoff_max = backoff_max
        self.log = log or logger
        self.stopping = threading.Event()
        self.subscribed = threading.Event()  # set while subscribed
        self.failures = 0

    def run(self):
        while not self.stopping.is_set():
            pubsub = None
            try:
                pubsub = self.connect().pubsub()  # the confirmation is read below, not hidden
                pubsub.subscribe(self.channel)
                # Subscribed once Redis confirms it: a connection that accepts and stays silent (a
                # blackhole) must not count, nor have on_subscribed called as if it were.
                first = pubsub.get_message(timeout=self.ALIVE_SECONDS)
                if first is None:
                    raise redis.TimeoutError(f"no confirmation of the subscription in {self.ALIVE_SECONDS:g}s")
                if self.on_subscribed is not None:
                    self.on_subscribed()
                self.subscribed.set()
                if first["type"] == "message":
                    self._deliver(first["data"])
                if self.failures:
                    self.log.warning("%s: subscribed to %s again after %d failed attempts", self.name, self.channel,
                                     self.failures)
                    self.failures = 0
                heard, pinged = time.monotonic(), None
                while not self.stopping.is_set():
                    if self.idle is not None and self.idle():
                        self.stopping.set()
                        break
                    message = pubsub.get_message(timeout=self.POLL_SECONDS)
                    now = time.monotonic()
                    if message is not None:
                        heard, pinged = now, None  # a message or the reply to our PING: the connection lives
                        if message["type"] == "message":
                            self._deliver(message["data"])
                    elif pinged is not None and now - pinged >= self.ALIVE_SECONDS:
                        raise redis.TimeoutError(f"no reply to a PING in {self.ALIVE_SECONDS:g}s")
                    elif pinged is None and now - heard >= self.ALIVE_SECONDS:
                        pubsub.ping()
                        pinged = now
                    if self.tick is not None:
                        self.tick()
            except TRANSIENT_ERRORS as exc:
                self._failed(f"Redis unreachable ({exc}); resubscribing with back-off")
            except Exception:
                # A bug or an unexpected Redis error: log it loudly and keep trying, a dead listener is worse.
                self.log.exception("%s: the subscription to %s failed; resubscribing", self.name, self.channel)
                self._failed(None)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001 - closing a broken socket may fail; nothing to do
                        pass
        self.subscribed.clear()

    def _deliver(self, data):
        try:
            self.on_message(data)
        except Exception:
            self.log.exception("%s: handling a message of %s failed", self.name, self.channel)

    def _failed(self, why):
        self.subscribed.clear()
        self.failures += 1
        if why and self.failures == 1:
            self.log.warning("%s: %s", self.name, why)
        self.stopping.wait(backoff_delay(self.failures, first=0.1, cap=self.backoff_max, jitter=0.5))

    def stop(self, timeout=None):
        self.stopping.set()
        if timeout is not None and self.is_alive():
            self.join(timeout)
