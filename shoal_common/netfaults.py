"""After a network fault, no pooled connection that shared its path is trusted again.

A fault that kills one connection (a NAT or load-balancer drop, a half-open link, a cut) has
usually killed every connection of the process to that server; but the pool would hand the idle
ones out again once the network heals, and each would cost a full socket timeout before it fails
(redis-py's health-check PING waits as long on a dead socket). So when any connection of a
``FaultAwarePool`` meets a timeout or a connection error, every pool of the process to the same
server drops its idle connections: the next command opens a fresh one, which costs a millisecond
when the network is fine. Connections in use by another thread fail on their own within their
socket timeout; they are never handed out again either (redis-py disconnects a connection that
timed out).

TCP keepalive is on, with probes after 10 s idle (redis-py's own default is 30 s), so that a peer
gone without a FIN (host down, NAT entry dropped) breaks an idle connection within about 25 s.
"""
import socket
import threading
import weakref

import redis

# Probe an idle connection after 10 s, every 5 s, give up after 3 unanswered probes (Linux names).
KEEPALIVE_OPTIONS = {getattr(socket, name): value
                     for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
                     if hasattr(socket, name)}

FAULTS = (redis.ConnectionError, redis.TimeoutError)

_pools = weakref.WeakSet()
_lock = threading.Lock()


def _address(kwargs):
    # redis-py's defaults, for a pool made without them.
    return kwargs.get("host") or "localhost", int(kwargs.get("port") or 6379), kwargs.get("path")


def drop_idle_connections(address):
    """Every fault-aware pool of this process to ``address`` closes its idle connections."""
    with _lock:
        pools = [pool for pool in _pools if _address(pool.connection_kwargs) == address]
    for pool in pools:
        pool.disconnect(inuse_connections=False)


class _FaultAware:
    """Connection mixin: a timeout or connection error drops the idle connections that share its path."""

    def _fault(self):
        drop_idle_connections(_address({"host": getattr(self, "host", None), "port": getattr(self, "port", None),
                                        "path": getattr(self, "path", None)}))

    def connect(self, *args, **kwargs):
        try:
            return super().connect(*args, **kwargs)
        except FAULTS:
            self._fault()
            raise

    def send_packed_command(self, *args, **kwargs):
        try:
            return super().send_packed_command(*args, **kwargs)
        except FAULTS:
            self._fault()
            raise

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except FAULTS:
            self._fault()
            raise


_classes = {}


def fault_aware(connection_class):
    """``connection_class`` with the mixin (one subclass per class; itself if it already has it)."""
    if issubclass(connection_class, _FaultAware):
        return connection_class
    cls = _classes.get(connection_class)
    if cls is None:
        cls = _classes[connection_class] = type(f"FaultAware{connection_class.__name__}",
                                                (_FaultAware, connection_class), {})
    return cls


class FaultAwarePool(redis.ConnectionPool):
    """A ``ConnectionPool`` whose connections use TCP keepalive and drop their idle peers after a fault."""

    def __init__(self, connection_class=redis.Connection, **kwargs):
        if issubclass(connection_class, (redis.Connection, redis.SSLConnection)):
            kwargs.setdefault("socket_keepalive", True)
            kwargs.setdefault("socket_keepalive_options", KEEPALIVE_OPTIONS)
        super().__init__(connection_class=fault_aware(connection_class), **kwargs)
        with _lock:
            _pools.add(self)
