"""Change events (pub/sub) that tell a DiscoveryClient to drop a service's cache entry at once.

One daemon thread per process and Redis server, shared by every DiscoveryClient there (see
client._Hub), with a connection of its own made in that thread. It holds no reference to any
client, so dropped clients are collected; it ends once ``idle()`` says nobody listens any more.
When the subscription breaks, events may have been missed: every client is told to drop every
entry once it is back (``on_reconnect``).
"""
import json
import logging
import threading

from discovery_app.connection import TRANSIENT_ERRORS
from shoal_common.backoff import backoff_delay

logger = logging.getLogger("discovery_app.client")


class ChangeListener:
    def __init__(self, channel, connect, on_event, on_reconnect, backoff_max=10.0, idle=lambda: False,
                 tick=None):
        self.channel = channel
        self.idle = idle
        self.tick = tick  # called about twice a second while subscribed (the expiry sweep)
        self.connect = connect
        self.on_event = on_event
        self.on_reconnect = on_reconnect
        self.backoff_max = backoff_max
        self.ready = threading.Event()  # set while subscribed
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self.run, name="discovery-listener", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout=5.0):
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self):
        return self._thread is not None and self._thread.is_alive()

    def run(self):
        failures = 0
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self.connect().pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                pubsub.get_message(timeout=1.0)  # the subscribe confirmation: we are listening now
                self.on_reconnect()
                self.ready.set()
                failures = 0
                while not self._stop.is_set():
                    if self.idle():
                        self._stop.set()
                        break
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None:
                        self._dispatch(message["data"])
                    if self.tick is not None:
                        self.tick()
            except TRANSIENT_ERRORS as exc:
                if self.ready.is_set():
                    logger.warning("Discovery: lost the change-event subscription (%s); retrying", exc)
                self.ready.clear()
                failures += 1
                self._stop.wait(backoff_delay(failures, first=0.1, cap=self.backoff_max))
            except Exception:
                # Without events the cache still expires by its TTL: log loudly, keep trying.
                logger.exception("Discovery: change-event listener failed; restarting it")
                self.ready.clear()
                failures += 1
                self._stop.wait(backoff_delay(failures, first=0.1, cap=self.backoff_max))
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001 - closing a broken socket may fail; nothing to do
                        pass
        self.ready.clear()

    def _dispatch(self, data):
        try:
            event = json.loads(data)
            service = event["service"]
        except (ValueError, KeyError, TypeError):
            logger.warning("Discovery: ignoring an unreadable change event %r", data[:200])
            return
        logger.debug("Discovery: %s %s of %s", event.get("event"), event.get("instance_id"), service)
        self.on_event(service)
