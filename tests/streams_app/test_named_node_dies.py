"""The cluster node REDIS_URL names is SIGKILLed (master or replica) while a consumer consumes and the
test publishes: the consumer keeps consuming through the nodes it learned from the cluster, and a new
process starts while that node is down when REDIS_URL names other seeds too."""
import json
import threading

import pytest
import redis as redis_py

from tests.redis_cluster import RedisClusterServer
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def ha_cluster(tmp_path):
    cluster = RedisClusterServer(str(tmp_path / "ha"), masters=3, replicas=1).start()
    yield cluster
    cluster.stop()


class Publisher(threading.Thread):
    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.stop = threading.Event()
        self.acked = []

    def run(self):
        n = 0
        while not self.stop.wait(0.02):
            try:
                self.acked.append(self.client.xadd("jobs", {"payload": json.dumps({"n": n})}))
                n += 1
            except redis_py.RedisError:  # the failover: a caller retries
                pass


def _handled(client):
    return set(client.lrange("handled:jobs:a", 0, -1))


@pytest.mark.parametrize("role", ["master", "replica"])
def test_killing_the_named_node_does_not_stop_the_consumer(ha_cluster, run_consumer, role):
    client = ha_cluster.client()
    wanted = "master" if role == "master" else "slave"
    named = next(p for p in ha_cluster.ports if ha_cluster.node(p).info("replication")["role"] == wanted)
    client.xgroup_create("jobs", "a", id="$", mkstream=True)
    node = type("Node", (), {"url": f"redis+cluster://127.0.0.1:{named}/0"})
    consumer = run_consumer("jobs:a", server=node)
    consumer.wait_for_output("started", timeout=60)
    publisher = Publisher(client)
    publisher.start()
    try:
        wait_for(lambda: len(_handled(client)) >= 50, timeout=30, what="handling before the kill")
        ha_cluster.processes[named].kill()
        ha_cluster.processes[named].wait(10)
        mark = len(publisher.acked)
        wait_for(lambda: len(publisher.acked) >= mark + 200, timeout=60, what="publishing after the kill")
        after = set(publisher.acked[mark:mark + 200])
        try:
            wait_for(lambda: after <= _handled(client), timeout=30,
                     what=f"entries published after the named node {named} died handled")
        except AssertionError:
            print(consumer.output()[-5000:])
            raise
        # A new process starts while the named node is down, when REDIS_URL names the others too.
        seeds = ",".join(f"127.0.0.1:{p}" for p in ha_cluster.ports)
        late = run_consumer("jobs:b", server=type("Seeds", (), {"url": f"redis+cluster://{seeds}/0"}))
        late.wait_for_output("started", timeout=30)
        assert "Redis unreachable at start" not in late.output()
    finally:
        publisher.stop.set()
        publisher.join()
    assert consumer.proc.poll() is None, consumer.output()[-3000:]
