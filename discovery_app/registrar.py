"""``Registrar``: keeps one instance registered for the life of a process.

``start()`` registers and heartbeats from a daemon thread; ``stop()`` (also run at interpreter
exit) deregisters. Every Redis connection is made inside that thread, so a gunicorn master can
run a Registrar without handing sockets to the workers it forks, and exit hooks inherited by
those workers do nothing (only the process that started it deregisters). Redis outages are
retried with capped back-off; the first heartbeat after one re-registers the instance if its
record has gone.
"""
import atexit
import logging
import os
import threading

from discovery_app.conf import get_settings
from discovery_app.connection import TRANSIENT_ERRORS, dedicated_connection
from discovery_app.registry import ServiceRegistry, build_instance
from shoal_common.backoff import backoff_delay

logger = logging.getLogger("discovery_app.registrar")


class Registrar:
    def __init__(self, service, address, port, metadata=None, interval=None, registry=None,
                 instance_id=None, ttl=None):
        config = get_settings()
        # Validates now, in the caller, so a bad registration fails loudly instead of in a thread.
        self.instance = build_instance(service, address, port, metadata, instance_id)
        self.metadata = metadata
        self.interval = float(config["HEARTBEAT_INTERVAL"] if interval is None else interval)
        self.ttl = ttl
        self.backoff_max = config["RETRY_BACKOFF_MAX"]
        self.registry = registry
        self.registered = threading.Event()
        self.deregistered_by_operator = False
        self._first_attempt = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self._pid = None

    @property
    def instance_id(self):
        return self.instance.instance_id

    def start(self, wait=5.0):
        """Start the heartbeat thread; wait up to ``wait`` s for the first registration attempt."""
        self._pid = os.getpid()
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"discovery-registrar-{self.instance.service}",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        if wait:
            self._first_attempt.wait(wait)
        return self

    def stop(self, timeout=5.0):
        """Stop heartbeating and deregister. Does nothing in a forked child of the starter."""
        if self._pid != os.getpid() or self._thread is None:
            return
        atexit.unregister(self.stop)
        self._stop.set()
        self._thread.join(timeout)
        self._thread = None
        try:
            self._registry().deregister(self.instance_id, service=self.instance.service)
        except TRANSIENT_ERRORS as exc:
            logger.warning("Discovery: could not deregister %s (%s); it expires after its TTL",
                           self.instance_id, exc)
        self.registered.clear()

    def run(self):
        registry = self._registry()
        failures = 0
        registered = False
        while not self._stop.is_set():
            try:
                if not registered:
                    registry.register(self.instance.service, self.instance.address, self.instance.port,
                                      self.metadata, instance_id=self.instance_id)
                    registered = True
                    self.registered.set()
                elif registry.heartbeat(self.instance_id) == "deregistered":
                    self.deregistered_by_operator = True
                    self.registered.clear()
                    logger.warning("Discovery: %s was deregistered by someone else; heartbeats stop",
                                   self.instance_id)
                    return
                if failures:
                    logger.info("Discovery: the registry is reachable again; %s is registered", self.instance_id)
                failures = 0
                wait = self.interval
            except Exception as exc:
                # Transient (connection lost) or not (OOM, READONLY during a failover, a bug): a
                # heartbeat thread that dies leaves a live instance unlisted for good, so it backs
                # off and tries again, re-registering in full when it gets through.
                failures += 1
                backoff = backoff_delay(failures, first=0.2, cap=min(self.backoff_max, self.interval))
                registered = registered and isinstance(exc, TRANSIENT_ERRORS)
                logger.warning("Discovery: cannot reach the registry for %s (%s: %s); retrying in %.1f s",
                               self.instance_id, type(exc).__name__, exc, backoff,
                               exc_info=not isinstance(exc, TRANSIENT_ERRORS))
                wait = backoff
            finally:
                self._first_attempt.set()
            self._stop.wait(wait)

    def _registry(self):
        if self.registry is None:
            # Made lazily in whichever thread needs it; never in the process that forks workers' sockets.
            self.registry = ServiceRegistry(dedicated_connection(), ttl=self.ttl)
        return self.registry
