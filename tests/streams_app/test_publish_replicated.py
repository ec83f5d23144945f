"""publish_many(..., replicas=n) against real replicas: when it returns, every replica has every entry.

WAIT goes once to each master that received entries, after its last batch, on the connection that
wrote them. Checked on a replica right after the call returns: no waiting of our own.
"""
import json

import pytest

from streams_app import publish_many
from streams_app.partitioning import partitions
from tests.redis_cluster import RedisClusterServer
from tests.waiting import wait_for


def wait_calls(client):
    return client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)


def test_publish_many_returns_once_the_replica_has_every_entry(redis_factory, use_redis):
    master, replica = redis_factory(), redis_factory()
    copy = replica.client()
    copy.replicaof("127.0.0.1", master.port)
    wait_for(lambda: copy.info("replication").get("master_link_status") == "up", timeout=30, what="the replica")
    use_redis(master)
    for _ in range(3):
        ids = publish_many("jobs", [{"n": n} for n in range(2500)], replicas=1, replicas_timeout_ms=4000)
        assert copy.xrange("jobs")[-2500:][-1][0] == ids[-1]  # already there, the last batch included
    assert copy.xlen("jobs") == 7500
    assert wait_calls(master.client()) == 3  # one WAIT per call, not per batch of 1000


@pytest.fixture
def ha_cluster(tmp_path):
    cluster = RedisClusterServer(str(tmp_path / "ha"), masters=3, replicas=1).start()
    yield cluster
    cluster.stop()


@pytest.mark.slow
def test_publish_many_on_a_partitioned_stream_waits_on_each_master_that_got_entries(ha_cluster, settings):
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": ha_cluster.url}}
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    client = ha_cluster.client()
    masters = {n.port for n in client.get_primaries()}
    replicas = {}
    for port in set(ha_cluster.ports) - masters:
        replicas[int(ha_cluster.node(port).info("replication")["master_port"])] = port
    before = {port: wait_calls(ha_cluster.node(port)) for port in masters}

    ids = publish_many("orders", [{"n": n} for n in range(2500)], keys=[f"k{n}" for n in range(2500)],
                       replicas=1, replicas_timeout_ms=4000)

    assert {port: wait_calls(ha_cluster.node(port)) - before[port] for port in masters} == dict.fromkeys(masters, 1)
    seen = {}
    for name in partitions.names("orders"):
        replica = ha_cluster.node(replicas[client.get_node_from_key(name).port])
        replica.execute_command("READONLY")
        seen.update({(name, entry_id): json.loads(fields["payload"])["n"] for entry_id, fields in replica.xrange(name)})
    # Partitions are streams of their own: an id is only unique within its partition.
    assert [seen[partitions.route("orders", f"k{n}"), entry_id] for n, entry_id in enumerate(ids)] == list(range(2500))
