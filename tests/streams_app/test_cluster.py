"""Shoal on a Redis Cluster: what only a cluster can get wrong (the rest runs on both via ``both_redis``).

The session cluster (tests/conftest.py ``redis_cluster``) has 3 masters; a test that breaks a
cluster makes one of its own.
"""
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis as redis_lib
from redis.cluster import RedisCluster

from streams_app.web.health import check_redis
from shoal_common.redisconn import TRANSIENT_ERRORS, ConnectionFactory, node_client
from streams_app import publish_many
from streams_app.conf import get_settings
from streams_app.redis.connection import dedicated_connection, get_connection
from streams_app.consuming.loop import GroupLoop
from streams_app.consuming.worker import Shutdown, Worker
from streams_app.redis.keys import liveness_key
from streams_app.registry import ConsumerSpec
from tests.redis_cluster import RedisClusterServer
from tests.testapp.consumers import behave
from tests.waiting import wait_for


@pytest.fixture
def cluster(redis_cluster, settings):
    """Django pointed at the session cluster, emptied before and after."""
    client = redis_cluster.client()
    redis_cluster.flushall(client)
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": redis_cluster.url}}
    yield client
    redis_cluster.flushall(client)
    client.close()


def stream_off_default_node(conn, prefix="ghost"):
    """A stream name whose slot is NOT on the node the cluster client sends keyless commands to."""
    default = conn.get_default_node().name
    for i in range(1000):
        name = f"{prefix}{i}"
        if conn.get_node_from_key(name).name != default:
            return name
    raise AssertionError("every name landed on the default node")


def make_loop(stream, name="me", **overrides):
    spec = ConsumerSpec(stream=stream, group="a", handler=behave)
    config = {**get_settings(), "BLOCK_MS": 50, **overrides}
    return GroupLoop(spec, name, conn=get_connection(), reader=dedicated_connection(f"test-{name}"),
                     executor=ThreadPoolExecutor(2), threads=2, shutdown=Shutdown(), config=config)


def test_a_node_url_gives_a_cluster_client_and_redis_plus_cluster_forces_it(cluster, redis_cluster, settings):
    assert isinstance(get_connection(), RedisCluster)
    forced = ConnectionFactory({}).connect(redis_cluster.url.replace("redis://", "redis+cluster://"))
    assert isinstance(forced, RedisCluster) and forced.ping()


def test_a_single_server_url_gives_a_plain_client(redis):
    conn = get_connection()
    assert not isinstance(conn, RedisCluster) and conn.ping()


def test_dedicated_connections_carry_their_name_on_the_node_of_the_key(cluster):
    reader = dedicated_connection("shoal-reader:someone")
    reader.xlen("orders")
    names = {c["name"] for c in node_client(cluster, "orders").client_list()}
    assert "shoal-reader:someone" in names


def test_ghost_a_paused_consumer_connected_to_a_non_default_node_is_not_taken_over(cluster):
    """Regression: CLIENT LIST asked the default node, so a live reader elsewhere looked dead."""
    conn = get_connection()
    stream = stream_off_default_node(conn)
    node = conn.get_node_from_key(stream)
    # Paused rather than dead: its reader's socket to the stream's node stays open.
    frozen = redis_lib.Redis(host=node.host, port=node.port, client_name="shoal-reader:frozen")
    frozen.ping()
    cluster.xgroup_create(stream, "a", id="0", mkstream=True)
    ids = publish_many(stream, [{"n": i} for i in range(3)])
    cluster.xreadgroup("a", "frozen", {stream: ">"})
    cluster.hset(liveness_key(stream), "frozen", 1)  # its liveness deadline lapsed long ago
    loop = make_loop(stream, PENDING_TIMEOUT_MS=600_000, CLAIM_INTERVAL_MS=10, RETRY_BACKOFF=0.01)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # many claim passes
        loop.tick()
    assert cluster.llen(f"started:{stream}:a") == 0, "took entries from a consumer that is still connected"
    frozen.close()  # now it is really gone
    deadline = time.monotonic() + 15
    while sorted(cluster.lrange(f"handled:{stream}:a", 0, -1)) != sorted(ids):
        assert time.monotonic() < deadline, "the dead consumer's entries were never taken over"
        loop.tick()


def test_shutdown_unblocks_a_reader_blocked_on_a_non_default_node(cluster, settings):
    settings.STREAMS = {**settings.STREAMS, "CLAIM_INTERVAL_MS": 60_000}  # else a claim pass cuts BLOCK short
    conn = get_connection()
    stream = stream_off_default_node(conn, prefix="idle")
    spec = ConsumerSpec(stream=stream, group="a", handler=behave)
    worker = Worker([spec], threads=1, block_ms=20_000, name="unblockme")
    worker.boot()
    node = node_client(conn, stream)
    wait_for(lambda: any(c.get("name") == worker.reader_client_name and c.get("cmd") == "xreadgroup"
                         for c in node.client_list()), timeout=30, what="the blocked read on the stream's node")
    started = time.monotonic()
    worker.stop(graceful=True)
    [thread] = worker.threads_
    thread.join(15)  # BLOCK is 20 s: a read that ended before that was cut short
    assert not thread.is_alive() and time.monotonic() - started < 15, "the blocked read ran out its BLOCK"
    worker.executor.shutdown()


def test_readyz_checks_the_cluster_state_and_a_loop_survives_a_lost_master(tmp_path, settings):
    """A master down with no replica: CLUSTERDOWN / connection errors, which are transient."""
    broken = RedisClusterServer(str(tmp_path)).start()
    try:
        settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": broken.url}}
        check_redis(2.0)  # healthy: no exception
        conn = get_connection()
        victim = conn.get_node_from_key("jobs")
        stream = "jobs"
        loop = make_loop(stream)
        loop.step()
        broken.processes[victim.port].kill()
        broken.processes[victim.port].wait(10)
        # Other nodes mark the cluster failed after the node timeout (2 s).
        survivor = next(p for p in broken.ports if p != victim.port)

        def state_fails():
            try:
                return broken.node(survivor).cluster("info")["cluster_state"] == "fail"
            except redis_lib.RedisError:
                return False

        wait_for(state_fails, timeout=30, what="the cluster to notice the lost master")
        with pytest.raises(Exception, match="cluster_state is fail|ConnectionError|answered"):
            check_redis(2.0)
        for _ in range(3):
            loop.step()  # must not raise: the outage is transient
        assert loop.failures >= 1
    finally:
        broken.stop()


def test_the_cluster_errors_are_transient():
    from redis.exceptions import ClusterDownError, MasterDownError, MovedError, SlotNotCoveredError, TryAgainError
    for error in (ClusterDownError, MasterDownError, TryAgainError, SlotNotCoveredError, MovedError):
        assert issubclass(error, TRANSIENT_ERRORS)


def test_a_consumer_started_while_redis_is_down_waits_for_it(redis_factory, run_consumer):
    """Whether REDIS_URL is a cluster is asked of Redis at start: an outage then is waited out."""
    server = redis_factory()
    server.stop()
    proc = run_consumer("jobs:a", server=server)
    proc.wait_for_output("Redis unreachable at start", timeout=60)
    server.start()
    client = server.client()
    client.xadd("jobs", {"payload": "{}"})
    wait_for(lambda: client.llen("handled:jobs:a") == 1, timeout=60, what="the entry handled once Redis is up")
    assert proc.proc.poll() is None


def test_a_read_cut_short_because_its_master_became_a_replica_is_transient(redis_factory, use_redis, settings):
    """CLUSTER FAILOVER turns the old master into a replica, which ends blocked reads with -UNBLOCKED.

    Found by test_failover.py (a read loop crashed, its worker exited); reproduced here on one server
    turned into a replica with REPLICAOF, which does the same to its blocked clients.
    """
    import threading

    master, other = redis_factory(), redis_factory()
    use_redis(master)
    settings.STREAMS = {**settings.STREAMS, "CLAIM_INTERVAL_MS": 60_000}
    master.client().xgroup_create("jobs", "a", id="$", mkstream=True)
    loop = make_loop("jobs", BLOCK_MS=10_000, CLAIM_INTERVAL_MS=60_000)
    errors = []

    def step():
        try:
            loop.step()
        except Exception as exc:  # noqa: BLE001 - what the read loop would die of
            errors.append(exc)

    reader = threading.Thread(target=step)
    reader.start()
    node = master.client()
    wait_for(lambda: any(c.get("cmd") == "xreadgroup" for c in node.client_list()), timeout=30, what="a blocked read")
    node.replicaof("127.0.0.1", other.port)
    reader.join(30)
    node.replicaof("no", "one")
    assert not reader.is_alive() and not errors, errors
    assert loop.failures == 1  # taken as an outage: backed off, will retry
