"""A daemon thread that stays subscribed to one pub/sub channel through Redis outages.

It makes its connection inside the thread (nothing made in a pre-fork master is shared), hands each
message's data to ``on_message``, and after a lost subscription resubscribes with back-off and calls
``on_subscribed`` again: pub/sub is at most once, so a user that caches (the discovery client) drops
what it may have missed then. A failing ``on_message`` is logged and the thread goes on.

While subscribed it polls every ``POLL_SECONDS``; after each poll ``tick()`` runs (periodic work that
must share the thread, e.g. discovery's expiry sweep), and ``idle()`` returning True ends the thread
(nobody listens any more).

A subscription whose network path died silently (a NAT or load-balancer entry dropped, a blackhole)
raises nothing: the socket stays open and simply never delivers again, so the thread would wait for
ever and its users would miss every message after the network heals. So a subscription counts only
once Redis has confirmed it, and after ``QUIET_SECONDS`` without hearing from Redis the thread PINGs
on it; no answer within ``ANSWER_SECONDS`` and it is dropped and made again (with back-off).
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
    QUIET_SECONDS = 5.0  # nothing heard for this long: PING on the subscription
    ANSWER_SECONDS = 3.0  # the subscribe confirmation or the PING's answer, or the subscription is dead
    PING_TOKEN = "shoal-subscriber-alive"

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
                pubsub = self.connect().pubsub()
                pubsub.subscribe(self.channel)
                # Subscribed only once Redis says so: a subscription sent down a dead path (a
                # blackhole) is never confirmed, and counting it would end the outage too early.
                self._confirm(pubsub)
                if self.on_subscribed is not None:
                    self.on_subscribed()
                self.subscribed.set()
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
                        heard, pinged = now, None
                        if message["type"] == "message":
                            self._deliver(message["data"])
                    elif pinged is not None and now - pinged > self.ANSWER_SECONDS:
                        raise redis.TimeoutError(f"no answer to PING on the subscription within {self.ANSWER_SECONDS:g} s")
                    elif pinged is None and now - heard > self.QUIET_SECONDS:
                        pubsub.ping(self.PING_TOKEN)
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

    def _confirm(self, pubsub):
        """Wait for the subscribe confirmation; messages never come before it (Redis answers the
        SUBSCRIBE first)."""
        deadline = time.monotonic() + self.ANSWER_SECONDS
        while not self.stopping.is_set():
            message = pubsub.get_message(timeout=min(self.POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            if message is not None and message["type"] == "subscribe":
                return
            if time.monotonic() >= deadline:
                raise redis.TimeoutError(f"SUBSCRIBE not confirmed within {self.ANSWER_SECONDS:g} s")

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
