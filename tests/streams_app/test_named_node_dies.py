"""The cluster node REDIS_URL names is SIGKILLed (master or replica) while a consumer consumes and the
test publishes: the consumer keeps consuming through the nodes it learned from the cluster, and a new
process starts while that node is down when REDIS_URL names other seeds too. The reclaim daemon
likewise keeps making passes, on the surviving masters' slots at once and on the lost master's once its
replica took over.

    nice -n 10 .venv/bin/pytest -s tests/streams_app/test_named_node_dies.py  # prints the recovery times
"""
import json
import signal
import threading
import time

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


RECLAIM_STREAMS = {"jobs": ("a", 5), "coro": ("g", 2), "exits": ("g", 3)}  # registered: group, max_deliveries


def _master_port(client, stream):
    return client.get_node_from_key(stream).port


def _over_limit(client, stream):
    """An entry of ``stream`` delivered max_deliveries times to a consumer long gone: the reclaimer's to
    dead-letter. Retried through the failover (the test's client learns the new master as a caller would)."""
    group, limit = RECLAIM_STREAMS[stream]

    def put():
        try:
            entry = client.xadd(stream, {"payload": json.dumps({"stream": stream})})
            client.xreadgroup(group, "ghost", {stream: ">"})
            client.xclaim(stream, group, "ghost", 0, [entry], idle=600_000, retrycount=limit, justid=True)
            return entry
        except redis_py.ResponseError as exc:
            if "NOGROUP" in str(exc):
                # Replication is asynchronous: the promoted replica may lack the group created just before
                # the kill (seen in 1 of ~10 runs). Made again, as an operator would; the reclaimer is under test.
                try:
                    client.xgroup_create(stream, group, id="0", mkstream=True)
                except redis_py.RedisError:
                    pass
            return None
        except redis_py.RedisError:
            return None

    return wait_for(put, timeout=30, what=f"an over-limit entry written to {stream}")


def _dead_lettered(client, stream, entry):
    try:
        return entry in {f["shoal:origin_id"] for _, f in client.xrange(f"{{{stream}}}:dlq")}
    except redis_py.RedisError:
        return False


@pytest.mark.parametrize("role,seeds", [("master", "single"), ("master", "list"), ("replica", "single")])
def test_the_reclaimer_keeps_working_when_the_named_node_dies(ha_cluster, run_consumer, role, seeds):
    """``runreclaimer`` with REDIS_URL naming one node (alone or first of a seed list), SIGKILLed while the
    daemon runs: later passes dead-letter over-limit entries on a surviving master's slot and, once a replica
    took over, on the failed node's slot too."""
    client = ha_cluster.client()
    for stream, (group, _) in RECLAIM_STREAMS.items():
        client.xgroup_create(stream, group, id="0", mkstream=True)
    masters = {p for p in ha_cluster.ports if ha_cluster.node(p).info("replication")["role"] == "master"}
    if role == "master":
        named = _master_port(client, "jobs")
        lost, kept = "jobs", next(s for s in RECLAIM_STREAMS if _master_port(client, s) != named)
    else:
        named = next(p for p in ha_cluster.ports if p not in masters)
        lost, kept = None, "jobs"
    others = [p for p in ha_cluster.ports if p != named]
    hosts = ",".join(f"127.0.0.1:{p}" for p in [named, *(others if seeds == "list" else [])])
    daemon = run_consumer("--interval", "0.5", command="runreclaimer",
                          server=type("Seeds", (), {"url": f"redis+cluster://{hosts}/0"}))
    daemon.wait_for_output("Reclaimer: watching", timeout=60)
    before = _over_limit(client, kept)
    wait_for(lambda: _dead_lettered(client, kept, before), timeout=30, what="a pass before the kill")

    ha_cluster.processes[named].kill()
    ha_cluster.processes[named].wait(10)
    killed = time.monotonic()
    try:
        entry = _over_limit(client, kept)
        wait_for(lambda: _dead_lettered(client, kept, entry), timeout=30,
                 what=f"{kept} (slot on a surviving master) dead-lettered after node {named} died")
        print(f"{role}/{seeds}: surviving slot dead-lettered {time.monotonic() - killed:.1f} s after the kill")
        if lost:
            entry = _over_limit(client, lost)  # waits for the failover
            wait_for(lambda: _dead_lettered(client, lost, entry), timeout=30,
                     what=f"{lost} (slot of the killed master {named}) dead-lettered after the failover")
            print(f"{role}/{seeds}: failed-over slot dead-lettered {time.monotonic() - killed:.1f} s after the kill")
    except AssertionError:
        print(daemon.output()[-5000:])
        raise
    assert daemon.proc.poll() is None, daemon.output()[-3000:]
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0, daemon.output()[-3000:]
