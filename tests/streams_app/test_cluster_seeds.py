"""Several seed nodes of a Redis Cluster in REDIS_URL: parsed, checked, and used to start while the
first one is down."""
import pytest

from shoal_common.cache import redis_cache, split_seeds
from shoal_common.redisconn import ConnectionFactory, is_cluster
from streams_app.checks import _seed_errors
from tests.redis_server import free_port


def test_a_url_with_several_hosts_keeps_the_first_in_location_and_every_one_as_a_seed():
    entry = redis_cache("redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001, 10.0.0.3:7002/0")
    assert entry["LOCATION"] == "redis+cluster://u:pw@10.0.0.1:7000/0"
    assert entry["OPTIONS"]["CLUSTER_SEEDS"] == ["10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"]
    assert "CLUSTER_SEEDS" not in redis_cache("redis://10.0.0.1:6379/0")["OPTIONS"]
    assert split_seeds("redis://h:1/0") == ("redis://h:1/0", [])


@pytest.mark.parametrize("seeds, problem", [
    (["10.0.0.1:7000", "10.0.0.2"], "seed '10.0.0.2' is not HOST:PORT"),
    (["10.0.0.1:70000"], "seed '10.0.0.1:70000' is not HOST:PORT"),
    ("10.0.0.1:7000", "a list of HOST:PORT strings is needed"),
])
def test_a_bad_seed_is_reported_by_the_check(seeds, problem):
    [error] = _seed_errors("default", seeds)
    assert error.id == "streams_app.E041" and problem in error.msg


def test_good_seeds_pass_the_check():
    assert _seed_errors("default", ["10.0.0.1:7000", "[::1]:7001"]) == []
    assert _seed_errors("default", None) == []


def test_a_process_starts_while_the_seed_in_location_is_down(redis_cluster):
    down = free_port()
    entry = redis_cache(",".join([f"redis+cluster://127.0.0.1:{down}", *(f"127.0.0.1:{p}" for p in redis_cluster.ports)]) + "/0")
    factory = ConnectionFactory(entry["OPTIONS"])
    client = factory.connect(entry["LOCATION"])
    assert is_cluster(client)
    client.set("seeded", "1")
    assert client.get("seeded") == b"1"
    factory.disconnect(client)


def test_cluster_clients_use_tcp_keepalive(redis_cluster):
    import socket

    from shoal_common.redisconn import dedicated_connection

    entry = redis_cache(f"redis+cluster://127.0.0.1:{redis_cluster.port}/0")
    factory = ConnectionFactory(entry["OPTIONS"])
    shared = factory.connect(entry["LOCATION"])
    for client in (shared, dedicated_connection(shared, "test-keepalive")):
        node = client.get_node_from_key("k")
        conn = client.get_redis_connection(node).connection_pool.get_connection()
        try:
            assert conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert conn._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10  # redis-py's: 30
        finally:
            client.get_redis_connection(node).connection_pool.release(conn)
