"""publish_many on a cluster sends each batch on a plain pipeline to the stream's node (cheaper than the
cluster client's); a slot that moved since the client last looked is followed, nothing lost or doubled."""
import pytest
from redis.crc import key_slot

from streams_app import publish_many
from streams_app.redis.connection import get_connection
from tests.redis_cluster import RedisClusterServer


@pytest.fixture
def cluster(tmp_path, settings):
    server = RedisClusterServer(str(tmp_path / "cluster")).start()
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": server.url}}
    yield server
    server.stop()


def test_publish_many_follows_a_slot_that_moved_since_the_client_looked(cluster):
    conn = get_connection()
    publish_many("warm-up", [{"n": 0}])  # the client has its slot map now
    slot = key_slot(b"moving")
    source = conn.get_node_from_key("moving")
    target = next(n for n in conn.get_primaries() if n.name != source.name)
    target_id = cluster.node(target.port).cluster("myid")
    for node in [target, source, *(n for n in conn.get_primaries() if n.name not in (source.name, target.name))]:
        cluster.node(node.port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    assert conn.get_node_from_key("moving").name == source.name  # the client does not know yet

    ids = publish_many("moving", [{"n": n} for n in range(2500)])

    on_target = cluster.node(target.port)
    assert [entry_id for entry_id, _ in on_target.xrange("moving")] == ids
    assert cluster.node(source.port).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
