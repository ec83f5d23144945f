"""shoal_common.netfaults: after a fault, the pool's idle connections (dead along the same path) are
not handed out again; through the test proxy's blackhole, whose connections stay dead after the heal."""
import socket

import pytest
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from shoal_common.netfaults import FaultAwarePool
from shoal_common.redisconn import ConnectionFactory, dedicated_connection


def _client(proxy, pool_class):
    pool = pool_class(port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    return redis_py.Redis(connection_pool=pool)


def _two_idle_connections(client):
    pool = client.connection_pool
    first, second = pool.get_connection(), pool.get_connection()
    for conn in (first, second):
        conn.send_command("PING")
        conn.read_response()
        pool.release(conn)


def _two_at_once_answer(client):
    """Two connections in use at once (two threads' worth) each answer a PING."""
    pool = client.connection_pool
    conns = [pool.get_connection(), pool.get_connection()]
    try:
        for conn in conns:
            conn.send_command("PING")
            conn.read_response()
        return True
    finally:
        for conn in conns:
            pool.release(conn)


def _after_a_blackhole(proxy, client):
    _two_idle_connections(client)
    proxy.blackhole()
    proxy.heal()  # the connections it caught stay dead
    with pytest.raises(redis_py.TimeoutError):
        client.ping()  # the first dead one: its timeout is the fault


def test_after_a_timeout_the_idle_connections_are_dropped_not_reused(net_proxy):
    client = _client(net_proxy, FaultAwarePool)
    _after_a_blackhole(net_proxy, client)
    assert _two_at_once_answer(client)  # fresh connections, not the other dead one


def test_a_plain_pool_hands_the_other_dead_connection_out_again(net_proxy):
    # What the fault-aware pool is for: the same sequence on redis-py's own pool.
    client = _client(net_proxy, redis_py.ConnectionPool)
    _after_a_blackhole(net_proxy, client)
    with pytest.raises(redis_py.TimeoutError):
        _two_at_once_answer(client)


def test_connections_use_tcp_keepalive(net_proxy):
    client = _client(net_proxy, FaultAwarePool)
    conn = client.connection_pool.get_connection()
    assert conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if hasattr(socket, "TCP_KEEPIDLE"):
        assert conn._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
    client.connection_pool.release(conn)


def test_the_shared_pool_is_fault_aware(settings, net_proxy):
    factory = ConnectionFactory(settings.CACHES["default"]["OPTIONS"])
    assert factory.pool_cls is FaultAwarePool


def test_a_cluster_clients_node_pools_are_fault_aware(settings, redis_cluster):
    # redis-py clears the idle connections of the one node pool whose command failed; the process's
    # other clients of that node (shared, readers, node pipelines) must drop theirs too.
    factory = ConnectionFactory(settings.CACHES["default"]["OPTIONS"])
    shared = factory.connect(f"redis+cluster://127.0.0.1:{redis_cluster.port}/0")
    reader = dedicated_connection(shared, "reader", socket_timeout=3)
    for client in (shared, reader):
        pools = [node.redis_connection.connection_pool for node in client.get_nodes()]
        assert len(pools) == 3 and all(isinstance(pool, FaultAwarePool) for pool in pools)
    assert reader.get_connection_kwargs()["socket_timeout"] == 3 and reader.ping()
