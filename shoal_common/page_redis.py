"""Redis for a web page: a short timeout, one attempt, and after a failure no further waiting.

The shared django-redis pool's socket timeout (30 s) is sized for the consumers' blocking reads, and
redis-py retries a timed-out command. A page that makes three calls to a hung Redis through it
waits minutes and holds one of gunicorn's few threads all along. A page instead gets:

- ``short_timeout_client(shared, timeout)``: the same server(s) and options with ``timeout`` for
  connecting and for every reply, and no retry; one per (pool, timeout) in a process;
- ``OneAttempt``: a wrapper that remembers the first connection error of the request and raises it
  again at once for every later call, so a page waits on a hung Redis once, not once per call.
"""
import threading
import weakref

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shoal_common.redisconn import TRANSIENT_ERRORS, dedicated_connection, is_cluster

_clients = weakref.WeakKeyDictionary()  # django-redis pool (or cluster client) -> {timeout: client}
_lock = threading.Lock()


def _no_retry():
    return Retry(NoBackoff(), 0)


def _make(shared, timeout):
    if is_cluster(shared):
        return dedicated_connection(shared, socket_timeout=timeout, socket_connect_timeout=timeout,
                                    retry=_no_retry())
    pool = shared.connection_pool
    kwargs = dict(pool.connection_kwargs, socket_timeout=timeout, socket_connect_timeout=timeout,
                  retry=_no_retry(), retry_on_timeout=False, retry_on_error=[])
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs),
                       retry=_no_retry())


def short_timeout_client(shared, timeout):
    """A client like ``shared`` whose every call answers or fails within about ``timeout`` seconds."""
    owner = shared if is_cluster(shared) else shared.connection_pool
    with _lock:
        by_timeout = _clients.setdefault(owner, {})
        client = by_timeout.get(timeout)
        if client is None:
            client = by_timeout[timeout] = _make(shared, timeout)
        return client


class OneAttempt:
    """``client`` for one request: after its first connection error, every call raises that error at once.

    Pipelines it makes are wrapped too (their ``execute`` is the call that talks to Redis).
    ``unwrapped`` is the client itself, for code that must know a cluster client from a plain one.
    """

    def __init__(self, client, state=None):
        self.unwrapped = client
        self._state = state if state is not None else {}

    @classmethod
    def failed(cls, error):
        """For a page whose client could not even be made (the first connection's probe met a hung
        or absent Redis): every call fails at once with ``error``, as after any first failure."""
        return cls(_Unmade(), {"error": error})

    @property
    def failure(self):
        return self._state.get("error")

    def __getattr__(self, name):
        attr = getattr(self.unwrapped, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.failure is not None:
                # A ConnectionError whatever the first one was: every caller treats it as "Redis is away".
                raise redis.ConnectionError(f"{type(self.failure).__name__}: {self.failure} (not asked again on this page)")
            try:
                result = attr(*args, **kwargs)
            except TRANSIENT_ERRORS as exc:
                self._state["error"] = exc
                raise
            if name == "pipeline":
                return OneAttempt(result, self._state)
            return result

        return call


class _Unmade:
    """Stands in for the client OneAttempt.failed never made: OneAttempt raises before calling it."""

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise redis.ConnectionError("no Redis client could be made on this page")

        return call


def unwrap(conn):
    return getattr(conn, "unwrapped", conn)
