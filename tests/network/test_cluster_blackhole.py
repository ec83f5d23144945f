"""A consumer on Redis Cluster whose path to one node goes dead: a TCP proxy in front of every node
(tests/redis_cluster.py ``proxied``: the nodes announce the proxies' ports, so the consumer learns them
from the cluster) blackholes the node that holds the stream's slot for longer than the socket timeouts.
The pools inside redis-py's cluster client are not Shoal's fault-aware ones: redis-py drops the free
connections of a node's pool itself when one of them fails. After the heal the consumer reads and
handles again within the documented bound (docs/consuming.md "Network faults").

    nice -n 10 .venv/bin/pytest -s tests/network/test_cluster_blackhole.py  # prints the recovery time
"""
import json
import re
import signal
import time

import pytest

from streams_app.consuming.liveness import reader_client_name
from tests.redis_cluster import RedisClusterServer
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

RECOVERY_BOUND = 15  # seconds after the heal (docs/consuming.md)
FAULT = 12  # seconds: above the pool's SOCKET_TIMEOUT (5 s) and the reader's (BLOCK_MS + 5 s = 7 s)


@pytest.fixture
def proxied_cluster(tmp_path):
    cluster = RedisClusterServer(str(tmp_path / "proxied"), masters=3, proxied=True).start()
    yield cluster
    cluster.stop()


def _publish(node, names):
    return [node.xadd("jobs", {"payload": json.dumps({"name": name})}) for name in names]


def _consumer_names(proc, count):
    names = re.findall(r"Consumer (\S+): started", proc.output())
    return names if len(names) >= count else None


def _reading(node, consumer):
    """The consumer's reader is blocked in (or just back from) XREADGROUP on ``node``."""
    return any(c["name"] == reader_client_name(consumer) and c["cmd"] == "xreadgroup" and int(c["idle"]) <= 2
               for c in node.client_list())


@pytest.mark.parametrize("workers", [None, 2], ids=["single", "workers2"])
def test_a_cluster_consumer_reads_again_soon_after_one_node_is_blackholed(proxied_cluster, run_consumer, workers):
    client = proxied_cluster.client()
    client.xgroup_create("jobs", "a", id="$", mkstream=True)
    port = client.get_node_from_key("jobs").port  # the proxy's: what the cluster announces
    real = next(p for p, proxy in proxied_cluster.proxies.items() if proxy.port == port)
    node = proxied_cluster.node(real)  # the test's own path to the node: never through the proxy
    seeds = ",".join(f"127.0.0.1:{p.port}" for p in proxied_cluster.proxies.values())
    consumer = run_consumer("jobs:a", *(["--workers", str(workers)] if workers else []),
                            server=type("Seeds", (), {"url": f"redis+cluster://{seeds}/0"}))
    consumer.wait_for_output("started", timeout=60)
    before = _publish(node, range(10))
    wait_for(lambda: set(before) <= _handled(proxied_cluster), timeout=30, what="handling before the fault")
    names = wait_for(lambda: _consumer_names(consumer, workers or 1), timeout=30, what="every worker started")
    wait_for(lambda: all(_reading(node, n) for n in names), timeout=30, what="every worker reading")

    proxied_cluster.proxies[real].blackhole()
    time.sleep(FAULT)  # the fault itself is what is under test
    proxied_cluster.proxies[real].heal()
    healed = time.monotonic()
    after = _publish(node, range(10, 20))
    try:
        wait_for(lambda: set(after) <= _handled(proxied_cluster), timeout=RECOVERY_BOUND,
                 what=f"the entries published after the heal handled within {RECOVERY_BOUND} s of it")
    except AssertionError:
        print(consumer.output()[-5000:])
        raise
    print(f"cluster consumer ({workers or 1} worker(s)) recovered {time.monotonic() - healed:.1f} s after the heal")
    # Each connection that died in the fault and was used again would have cost a full socket timeout.
    proxy = proxied_cluster.proxies[real]
    assert proxy.stale_sends == 0, f"blackholed connections used after the heal: {proxy.stale_samples[:5]}"
    consumer.signal(signal.SIGTERM)
    assert consumer.wait(60) == 0, consumer.output()[-3000:]


def _handled(cluster):
    """The handled list, read by a client made now (the test's older connections may be blackholed ones)."""
    client = cluster.client()
    try:
        return set(client.lrange("handled:jobs:a", 0, -1))
    finally:
        client.close()
