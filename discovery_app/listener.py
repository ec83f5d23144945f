"""Change events (pub/sub) that tell a DiscoveryClient to drop a service's cache entry at once.

One daemon thread per process and Redis server, shared by every DiscoveryClient there (see
hub._Hub), with a connection of its own made in that thread (shoal_common.pubsub.Subscriber). It
holds no reference to any client, so dropped clients are collected; it ends once ``idle()`` says
nobody listens any more. When the subscription breaks, events may have been missed: every client is
told to drop every entry once it is back (``on_reconnect``).
"""
import json
import logging

from shoal_common.pubsub import Subscriber

logger = logging.getLogger("discovery_app.client")


class ChangeListener(Subscriber):
    POLL_SECONDS = 0.5  # the expiry sweep (``tick``) runs about twice a second

    def __init__(self, channel, connect, on_event, on_reconnect, backoff_max=10.0, idle=lambda: False,
                 tick=None):
        super().__init__(channel, connect, self._dispatch, name="discovery-listener", on_subscribed=on_reconnect,
                         backoff_max=backoff_max, log=logger, tick=tick, idle=idle)
        self.on_event = on_event

    @property
    def ready(self):
        """Set while subscribed."""
        return self.subscribed

    @property
    def alive(self):
        return self.is_alive()

    def _dispatch(self, data):
        try:
            event = json.loads(data)
            service = event["service"]
        except (ValueError, KeyError, TypeError):
            logger.warning("Discovery: ignoring an unreadable change event %r", data[:200])
            return
        logger.debug("Discovery: %s %s of %s", event.get("event"), event.get("instance_id"), service)
        self.on_event(service)
