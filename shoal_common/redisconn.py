"""Redis plumbing shared by both apps: one server or a Redis Cluster behind the same ``REDIS_URL``.

django-redis has no cluster client, so ``ConnectionFactory`` (our django-redis
``CONNECTION_FACTORY``) decides per URL, once per process, which client to build:

- ``redis+cluster://host:port/0`` forces cluster mode (no probe; start-up never depends on it);
- ``redis://`` asks the node (``INFO cluster``) and builds a ``RedisCluster`` when it says
  ``cluster_enabled:1``, a plain ``Redis`` on django-redis's shared pools otherwise.

Code that must know the difference uses the helpers below, never ``isinstance`` checks of its own:
per-node commands (CLIENT LIST/UNBLOCK/ID, INFO) go to ``node_client(conn, key)``, and Lua
scripts that share a pipeline with other commands use ``slot_pipeline(conn, key)`` (a cluster
pipeline refuses scripts; a plain pipeline on the node that holds the slot runs them).
"""
import contextlib
import contextvars
import logging
import os
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import redis
from django_redis.pool import ConnectionFactory as DjangoRedisConnectionFactory
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError, ClusterDownError, ClusterError, MasterDownError, MovedError, SlotNotCoveredError, TryAgainError,
)

from shoal_common import netfaults

CLUSTER_SCHEME = "redis+cluster"

# "Redis is not reachable right now": retry with back-off rather than crash. On a cluster this
# includes a failover in progress (CLUSTERDOWN, MASTERDOWN, TRYAGAIN, a slot nobody serves) and a
# slot that moved under a node pipeline (MOVED/ASK: the cluster client's own commands follow
# redirects and refresh its slot map, so the next pass goes to the right node).
TRANSIENT_ERRORS = (
    redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError,
    ClusterDownError, MasterDownError, TryAgainError, ClusterError, SlotNotCoveredError, MovedError, AskError,
)

# RedisCluster keyword arguments taken from django-redis's connection parameters.
_CLUSTER_KWARGS = ("username", "password", "socket_timeout", "socket_connect_timeout", "health_check_interval",
                   "socket_keepalive", "socket_keepalive_options")


def is_cluster(conn):
    # ``unwrapped``: a page's one-attempt wrapper (shoal_common.page_redis) around either kind.
    return isinstance(getattr(conn, "unwrapped", conn), RedisCluster)


def node_client(conn, key):
    """The plain client of the node that holds ``key``'s slot (``conn`` itself on one server).

    Per-node state (client ids, CLIENT LIST, INFO) only means something on that node: asked
    through the cluster client, these commands go to a default node instead.
    """
    if is_cluster(conn):
        return conn.get_redis_connection(conn.get_node_from_key(key))
    return conn


_RECOVER_EVERY = 1.0  # seconds: at most one topology refresh per client per second
_recovered_at = {}


def recover(conn):
    """After a transient error on a node-direct path: refresh a cluster client's slot map.

    The cluster client refreshes it itself when one of its own commands meets a dead node or a
    MOVED; a plain node client or pipeline (``node_client``, ``slot_pipeline``) does not, and would
    keep asking a dead master after its replica took over. Best effort: the cluster may be down.
    """
    if not is_cluster(conn):
        return
    now = time.monotonic()
    if now - _recovered_at.get(id(conn), 0.0) < _RECOVER_EVERY:
        return
    _recovered_at[id(conn)] = now
    try:
        conn.nodes_manager.initialize()
    except (redis.RedisError, redis.exceptions.RedisClusterException):
        pass  # the next error tries again


def slot_pipeline(conn, key, transaction=False):
    """A pipeline for commands that all touch ``key``'s slot, scripts included (MULTI/EXEC if ``transaction``)."""
    return node_client(conn, key).pipeline(transaction=transaction)


def per_slot(conn, keys):
    """``[(pipeline, keys)]``: ``keys`` grouped by the node that holds them, one plain pipeline each."""
    if not is_cluster(conn):
        return [(conn.pipeline(transaction=False), list(keys))]
    groups = {}
    for key in keys:
        node = conn.get_node_from_key(key)
        groups.setdefault(node.name, (node, []))[1].append(key)
    return [(conn.get_redis_connection(node).pipeline(transaction=False), node_keys)
            for node, node_keys in groups.values()]


def dedicated_connection(shared, client_name=None, **overrides):
    """A client with connections of its own (same servers and options as ``shared``).

    Its connections carry ``client_name`` (CLIENT SETNAME), which is how shutdown and the
    liveness guard find a consumer's blocking readers in CLIENT LIST.
    """
    if is_cluster(shared):
        kwargs = {k: v for k, v in shared.get_connection_kwargs().items() if k in _CLUSTER_KWARGS + ("decode_responses",)}
        kwargs.update(overrides)
        if client_name:
            kwargs["client_name"] = client_name
        nodes = [ClusterNode(n.host, n.port) for n in shared.get_nodes()]
        return _make_cluster(startup_nodes=nodes, **kwargs)
    pool = shared.connection_pool
    kwargs = dict(pool.connection_kwargs, **overrides)
    if client_name:
        kwargs["client_name"] = client_name
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs))


def _make_cluster(**kwargs):
    # Every node's pool fault-aware (shoal_common.netfaults), as on one server: redis-py drops the idle
    # connections of the one pool whose command failed, but not those of the process's other clients to
    # that node (the shared client, each reader, node pipelines), which would each cost a full socket
    # timeout after the network heals. redis-py takes a pool class only for a client made from a URL.
    kwargs.setdefault("connection_pool_class", netfaults.FaultAwarePool)
    if "url" not in kwargs:
        first, *others = kwargs.pop("startup_nodes")
        host = f"[{first.host}]" if ":" in first.host else first.host
        kwargs.update(url=f"redis://{host}:{first.port}/0", startup_nodes=others)
    try:
        return RedisCluster(**kwargs)
    except SlotNotCoveredError:
        raise
    except redis.exceptions.RedisClusterException as exc:
        # "cannot be connected" / "slots not covered" at start: an outage, which callers retry.
        raise redis.ConnectionError(str(exc)) from exc


def seed_node(seed):
    """ClusterNode of a "host:port" seed (shoal_common.cache.split_seeds); ValueError when it is not one."""
    host, sep, port = seed.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{seed!r} is not HOST:PORT")
    return ClusterNode(host.strip("[]"), int(port))


def cluster_url(url):
    """(is forced cluster, URL with a scheme redis-py understands)."""
    parts = urlsplit(url)
    if parts.scheme == CLUSTER_SCHEME:
        return True, urlunsplit(parts._replace(scheme="redis"))
    return False, url


# Set by a web page (probing_within): the seconds a first connection's probe may take, asked once.
_page_probe_timeout = contextvars.ContextVar("shoal_page_probe_timeout", default=None)


@contextlib.contextmanager
def probing_within(seconds):
    """Inside, a client made for the first time in this process probes the server within ``seconds``
    and without retrying: a web page never waits on a hung Redis longer than its own timeout
    (the probe's 5 s, retried by redis-py, suit a daemon that waits for Redis anyway)."""
    token = _page_probe_timeout.set(seconds)
    try:
        yield
    finally:
        _page_probe_timeout.reset(token)


def probe_cluster_mode(url, timeout=5, once=False):
    """True when the server at ``url`` runs with cluster-enabled (``INFO cluster``); ``once``: no retry."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                  **({"retry": Retry(NoBackoff(), 0)} if once else {}))
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.exceptions.NoPermissionError:
        # A least-privilege user may not run INFO (@dangerous): take a single server; a cluster's
        # users say so with redis+cluster://, which asks nothing.
        logging.getLogger("shoal_common").warning(
            "This Redis user may not run INFO, so Shoal cannot tell a cluster from a single server at %s; "
            "taking a single server. On a Redis Cluster use a redis+cluster:// URL.", url.split("@")[-1])
        return False
    finally:
        client.close()


class ConnectionFactory(DjangoRedisConnectionFactory):
    """django-redis ``CONNECTION_FACTORY``: a ``RedisCluster`` for a cluster URL, django-redis's client otherwise.

    One ``RedisCluster`` per (URL, process), shared by every thread (it is thread-safe and keeps a
    pool per node). Keyed by pid too: a forked worker must not reuse its parent's sockets.
    The mode is decided once per (URL, process); when the probe cannot reach Redis, the
    ConnectionError goes to the caller (which retries), and nothing is remembered.
    """

    _modes = {}
    _clusters = {}
    _lock = threading.Lock()

    def __init__(self, options):
        # Pooled connections that met a network fault are not handed out again (shoal_common.netfaults).
        options = {"CONNECTION_POOL_CLASS": "shoal_common.netfaults.FaultAwarePool", **options}
        super().__init__(options)

    def connect(self, url):
        key = (url, os.getpid())
        seeds = self.options.get("CLUSTER_SEEDS") or ()
        mode = self._modes.get(key)
        if mode is None:
            forced, plain_url = cluster_url(url)
            forced = forced or bool(seeds)  # several seed nodes: a cluster, whichever of them is up
            limit = _page_probe_timeout.get()
            probe = {"timeout": limit, "once": True} if limit is not None else {}
            mode = "cluster" if forced or probe_cluster_mode(plain_url, **probe) else "single"
            self._modes[key] = mode
        if mode == "single":
            return super().connect(url)
        with self._lock:
            client = self._clusters.get(key)
            if client is None:
                params = self.make_connection_params(url)
                # TCP keepalive on every node's connections, as on one server's (shoal_common.netfaults).
                kwargs = {"socket_keepalive": True, "socket_keepalive_options": netfaults.KEEPALIVE_OPTIONS}
                kwargs.update({k: v for k, v in params.items() if k in _CLUSTER_KWARGS})
                kwargs.update({k: v for k, v in self.pool_cls_kwargs.items() if k in _CLUSTER_KWARGS})
                kwargs.update(self.options.get("CLUSTER_KWARGS", {}))
                if seeds:  # every seed, not only the URL's host: a process starts while any one is down
                    kwargs.setdefault("startup_nodes", [seed_node(seed) for seed in seeds])
                client = self._clusters[key] = _make_cluster(url=cluster_url(url)[1], **kwargs)
        return client

    def disconnect(self, connection):
        if is_cluster(connection):
            connection.disconnect_connection_pools()
        else:
            super().disconnect(connection)
