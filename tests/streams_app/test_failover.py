"""A master of a Redis Cluster with replicas SIGKILLed while a partitioned stream is produced and consumed.

A cluster of 3 masters + 3 replicas of its own (~5 s to start), a runconsumer subprocess on the
partitioned stream ``failover``, and a producer in this process that publishes with ``replicas=1``
(WAIT: an acknowledged entry is on a replica, so a failover cannot lose it) and retries on errors as
a caller would. The handler records what it handled in a file, outside the Redis being failed over.
"""
import threading
import time
from collections import Counter

import pytest

from streams_app import publish
from streams_app.partitioning import partitions
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection
from streams_app.exceptions import NotReplicatedError, PartialPublishError
from tests.redis_cluster import NODE_TIMEOUT_MS, RedisClusterServer
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

N = 3
KEYS = 30


@pytest.fixture
def ha_cluster(tmp_path):
    cluster = RedisClusterServer(str(tmp_path / "ha"), masters=3, replicas=1).start()
    yield cluster
    cluster.stop()


class Producer(threading.Thread):
    """Publishes keyed messages until stopped; remembers what was acknowledged and how long errors lasted."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.acked = set()  # (partition stream, id) confirmed on a replica
        self.unconfirmed = set()  # stored on the master, no replica confirmed in time
        self.errors = 0
        self.kinds = Counter()
        self.first_error = self.last_error = None
        self.crashed = None
        self.last_exc = None

    def run(self):
        n = 0
        try:
            while not self.stop.is_set():
                key = f"k{n % KEYS}"
                stream = partitions.route("failover", key)
                try:
                    entry = publish("failover", {"n": n}, key=key, replicas=1, replicas_timeout_ms=500)
                    self.acked.add((stream, entry))
                    n += 1
                except NotReplicatedError as exc:
                    self.unconfirmed.add((stream, exc.id))
                    n += 1
                except (*TRANSIENT_ERRORS, PartialPublishError) as exc:  # the caller's retry
                    self.errors += 1
                    now = time.monotonic()
                    self.first_error = self.first_error or now
                    self.last_error = now
                    self.last_exc = exc
                    self.kinds[type(exc).__name__] += 1
                    self.stop.wait(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.crashed = exc


def handled(record):
    found = set()
    for path in record.parent.glob(record.name + ".*"):
        for line in path.read_text().splitlines():
            stream, entry = line.split()
            found.add((stream, entry))
    return found


def replica_of(cluster, master_port):
    for port in cluster.ports:
        info = cluster.node(port).info("replication")
        if info.get("role") == "slave" and int(info.get("master_port", 0)) == master_port:
            return port
    raise AssertionError(f"no replica of {master_port}")


@pytest.mark.parametrize("how", ["sigkill", "cluster-failover"])
def test_a_failover_loses_no_acknowledged_entry_and_no_process_exits(how, ha_cluster, settings, run_consumer, tmp_path):
    streams = {"PARTITIONS": {"failover": N}, "CLAIM_INTERVAL_MS": 500, "CONSUMER_TTL": 3}
    settings.STREAMS = {**settings.STREAMS, **streams}
    names = partitions.names("failover")
    victim = ha_cluster.client().get_node_from_key(names[0])
    # REDIS_URL names a node that survives (a process starting during the outage needs one to ask).
    url = f"redis://127.0.0.1:{next(p for p in ha_cluster.ports if p != victim.port)}/0"
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": url}}
    assert get_connection().get_node_from_key(names[0]).port == victim.port
    record = tmp_path / "handled"
    consumer = run_consumer("failover:f", server=type("Node", (), {"url": url}), streams=streams,
                            env={"SHOAL_TEST_RECORD_FILE": str(record)})
    consumer.wait_for_output("started", timeout=60)
    producer = Producer()
    producer.start()
    wait_for(lambda: len(producer.acked) >= 300, timeout=60, what="300 acknowledged entries before the kill")
    before = set(producer.acked)

    if how == "sigkill":
        ha_cluster.processes[victim.port].kill()  # no goodbye to the cluster
        ha_cluster.processes[victim.port].wait(10)
    else:
        ha_cluster.node(replica_of(ha_cluster, victim.port)).execute_command("CLUSTER", "FAILOVER")  # planned
    wait_for(lambda: ha_cluster.client().get_node_from_key(names[0]).port != victim.port, timeout=60,
             what="a replica promoted in place of the master")
    if how == "sigkill":
        # The operator brings the dead node back: it rejoins as the new master's replica (until
        # then WAIT 1 cannot succeed for that partition, and publish says NotReplicatedError).
        ha_cluster.restart_node(victim.port)
    try:
        wait_for(lambda: len(producer.acked) >= len(before) + 300, timeout=90,
                 what="300 more acknowledged entries after the failover")
    except AssertionError:
        raise AssertionError(f"publishing did not recover: {producer.errors} errors, the last {producer.last_exc!r}, "
                             f"crashed {type(producer.crashed).__name__}: {producer.crashed}, kinds {dict(producer.kinds)}, {len(producer.unconfirmed)} unconfirmed") from None
    producer.stop.set()
    producer.join(30)
    assert producer.crashed is None, f"{type(producer.crashed).__name__}: {producer.crashed}"

    try:
        wait_for(lambda: producer.acked <= handled(record), timeout=90, what="every acknowledged entry handled")
    except AssertionError:
        missing = producer.acked - handled(record)
        raise AssertionError(f"{len(missing)} acknowledged entries never handled, e.g. {sorted(missing)[:3]}; "
                             f"consumer output:\n{consumer.output()[-3000:]}") from None
    assert before <= handled(record)  # pending or unread before the kill: handled all the same
    assert consumer.proc.poll() is None, consumer.output()
    outage = (producer.last_error - producer.first_error) if producer.errors else 0.0
    print(f"failover ({how}): {len(producer.acked)} acknowledged, {len(producer.unconfirmed)} unconfirmed, "
          f"{producer.errors} publish errors over {outage:.2f} s (node timeout {NODE_TIMEOUT_MS} ms)")
    # Not a speed figure: a bound that says publishing came back after the failover at all.
    assert outage < 60
