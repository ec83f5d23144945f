"""What the DiscoveryClients of one process share: the change-event listener of each Redis server
(``_Hub``, held by its clients only weakly) and the set of every client, for ``invalidate`` (a
broadcast reaches them all) and for a fork (the child starts every client afresh).
"""
import logging
import os
import threading
import time
import weakref

from discovery_app import keys
from discovery_app.connection import TRANSIENT_ERRORS, is_cluster
from discovery_app.listener import ChangeListener
from discovery_app.registry import ServiceRegistry
from shoal_common.redisconn import dedicated_connection

logger = logging.getLogger("discovery_app.client")

SWEEP_PERIOD = 1.0
"""Seconds between expiry sweeps (one process sweeps per period; see ServiceRegistry.sweep)."""


# Every client of this process, so that a broadcast ("discovery.invalidate") reaches them all.
all_clients = weakref.WeakSet()


def invalidate(service=None):
    """Drop ``service`` (None: everything) from the cache of every DiscoveryClient in this process."""
    for client in list(all_clients):
        client.invalidate(service)


class _Hub:
    """The change-event listener of one Redis server, shared by this process's clients of it.

    Holds its clients weakly; its thread ends when the last one is closed or collected.
    """

    def __init__(self, key, connect, backoff_max):
        self.key = key
        self.clients = weakref.WeakSet()
        self.connect = connect
        self._sweeper = None  # a registry on a connection of the listener thread's own
        self._next_sweep = 0.0
        self.listener = ChangeListener(keys.events_channel(), connect, self._event, self._reconnect,
                                       backoff_max, idle=self._idle, tick=self._sweep)

    def _sweep(self):
        # Expiries are noticed when someone touches a service; the sweep makes them on time (within
        # about a second), in one process per second across the deployment (see registry.sweep).
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_PERIOD
        try:
            if self._sweeper is None:
                self._sweeper = ServiceRegistry(self.connect())
            self._sweeper.sweep(SWEEP_PERIOD)
        except TRANSIENT_ERRORS as exc:
            logger.debug("Discovery: expiry sweep skipped (%s)", exc)
            # A client whose cache stays fresh learns of the outage here: see DiscoveryClient._preserve.
            for client in self._members():
                client._note_outage()

    def _members(self):
        with _hubs_lock:
            return list(self.clients)

    def _event(self, service):
        for client in self._members():
            client.invalidate(service)

    def _reconnect(self):
        for client in self._members():
            client.invalidate(None)

    def _idle(self):
        with _hubs_lock:
            if self.clients:
                return False
            if _hubs.get(self.key) is self:
                del _hubs[self.key]  # the next client starts a new hub
            return True


_hubs: dict[tuple, _Hub] = {}
_hubs_lock = threading.Lock()


def hub_for(client):
    """Join ``client`` to the hub of its Redis server, starting one if needed."""
    conn = client.registry.connection
    if is_cluster(conn):
        # One hub per cluster (a PUBLISH reaches every node's subscribers), on a cluster client of
        # its own with the registry's short timeouts (the sweep's scripts need the slot routing).
        key = ("cluster", tuple(sorted(node.name for node in conn.get_nodes())),
               conn.get_connection_kwargs().get("username"), keys.events_channel())
    else:
        pool = conn.connection_pool
        kwargs = dict(pool.connection_kwargs)
        key = (pool.connection_class, kwargs.get("host"), kwargs.get("port"), kwargs.get("path"),
               kwargs.get("db"), kwargs.get("username"), keys.events_channel())
    with _hubs_lock:
        hub = _hubs.get(key)
        if hub is None or not hub.listener.alive:
            if is_cluster(conn):
                def connect():  # connections of its own, made in the listener's thread; no DiscoveryClient held
                    return dedicated_connection(conn)
            else:
                pool_class, connection_class = type(pool), pool.connection_class

                def connect():  # a pool of its own, made in the listener's thread; no reference to a client
                    import redis

                    return redis.Redis(connection_pool=pool_class(connection_class=connection_class, **kwargs))

            hub = _hubs[key] = _Hub(key, connect, client.backoff_max)
            hub.clients.add(client)
            hub.listener.start()
        else:
            hub.clients.add(client)
    return hub


def _after_fork_in_child():
    # The child has only the forking thread. A lock another thread held at the fork stays held
    # for ever in the child, and the parent's listener threads, sockets and calls in flight are
    # not the child's: start every client of this process afresh (their caches stay).
    global _hubs_lock
    _hubs_lock = threading.Lock()
    _hubs.clear()
    for client in list(all_clients):
        client._reset_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def leave(hub, client):
    """``client`` is closed: the hub's thread ends once no client is left."""
    with _hubs_lock:
        hub.clients.discard(client)
