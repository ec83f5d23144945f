"""The same work on one redis-server and on a local 3-master Redis Cluster, with 1, 3 and 6 partitions.

    .venv/bin/python bench/cluster.py            # --quick: 20,000 messages per configuration (~1-2 min)
    .venv/bin/python bench/cluster.py --messages 100000 --repeat 3

Per configuration (a fresh stream ``noop`` with STREAMS["PARTITIONS"] = {"noop": N}): this process
publishes M keyed messages with publish_many (10,000 per call), then one ``runconsumer noop:bench``
process (no-op handler, default settings, one read loop per partition) consumes them, timed from its
first read to the last ack. Reported: msgs/s of each phase, client CPU per message (this process while
publishing; the consumer process while consuming), and server CPU per message from ``INFO cpu`` deltas
of every master (used_cpu_sys + used_cpu_user): the sum over masters and the busiest master, which is
what a cluster spreads over hosts. Each configuration runs in a child process of its own (Django and
its Redis client are set up once per process).

On a machine with few cores, wall-clock throughput will not scale with masters: the 3 masters, the
consumer and the publisher share the same CPUs. The CPU figures are what carry over to separate hosts.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, cpu_seconds, manage, setup_django, start_redis

PARTITION_COUNTS = (1, 3, 6)
CHUNK = 10_000


def server_cpu(ports):
    import redis

    out = {}
    for port in ports:
        info = redis.Redis(port=port).info("cpu")
        out[port] = info["used_cpu_sys"] + info["used_cpu_user"]
    return out


def child(args):
    """One configuration: publish, then consume; print a JSON line of figures."""
    setup_django(args.url)
    from streams_app import publish_many
    from streams_app.partitioning import partitions
    from streams_app.redis.connection import get_connection

    masters = [int(p) for p in args.masters.split(",")]
    names = partitions.names("noop")
    conn = get_connection()
    payloads = [{"n": n, "pad": "x" * 40} for n in range(args.messages)]
    keys = [f"customer-{n}" for n in range(args.messages)]

    def own_cpu():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    cpu0, server0, t0 = own_cpu(), server_cpu(masters), time.perf_counter()
    for start in range(0, args.messages, CHUNK):
        publish_many("noop", payloads[start : start + CHUNK], keys=keys[start : start + CHUNK])
    publish_seconds, publish_cpu = time.perf_counter() - t0, own_cpu() - cpu0
    server1 = server_cpu(masters)

    proc = manage("runconsumer", "noop:bench", "-v", "0", redis_url=args.url,
                  env={"SHOAL_TEST_STREAMS": json.dumps({"PARTITIONS": {"noop": args.partitions}})})
    try:
        deadline = time.monotonic() + 300
        started = consumer_cpu0 = server2 = None
        while time.monotonic() < deadline:
            # One pipelined XINFO GROUPS per partition every 10 ms: its server CPU is counted with the
            # consumer's (~2 µs a call; ~0.1 µs per message at 20,000 msgs/s with 6 partitions).
            pipe = conn.pipeline(transaction=False)
            for name in names:
                pipe.xinfo_groups(name)
            read = pending = 0
            for groups in pipe.execute(raise_on_error=False):
                for info in groups if isinstance(groups, list) else ():
                    if info["name"] in (b"bench", "bench"):
                        read += info["entries-read"] or 0
                        pending += info["pending"]
            now = time.perf_counter()
            if started is None and read > 0:
                started, consumer_cpu0, server2 = now, cpu_seconds(proc.pid), server_cpu(masters)
            if read >= args.messages and pending == 0:
                consume_seconds, consumer_cpu = now - started, cpu_seconds(proc.pid) - consumer_cpu0
                server3 = server_cpu(masters)
                break
            time.sleep(0.01)
        else:
            raise TimeoutError("the consumer did not finish in 300 s")
    finally:
        proc.terminate()
        proc.wait(60)
    per_master = {port: (server1[port] - server0[port]) + (server3[port] - server2[port]) for port in masters}
    m = args.messages
    print(json.dumps({
        "publish_rate": m / publish_seconds,
        "consume_rate": m / consume_seconds,
        "publish_client_us": publish_cpu / m * 1e6,
        "consume_client_us": consumer_cpu / m * 1e6,
        "server_publish_us": sum(server1[p] - server0[p] for p in masters) / m * 1e6,
        "server_consume_us": sum(server3[p] - server2[p] for p in masters) / m * 1e6,
        "server_total_us": sum(per_master.values()) / m * 1e6,
        "busiest_master_us": max(per_master.values()) / m * 1e6,
    }))


def run(kind, url, masters, flush, partitions, messages):
    flush()
    env = {**os.environ, "SHOAL_TEST_STREAMS": json.dumps({"PARTITIONS": {"noop": partitions}})}
    out = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", "--url", url, "--masters", ",".join(map(str, masters)),
         "--partitions", str(partitions), "--messages", str(messages)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    if out.returncode:
        raise RuntimeError(f"{kind} N={partitions} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per configuration (default 20,000: --quick)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (figures: the median)")
    parser.add_argument("--quick", action="store_true", help="the default: 20,000 messages, one run each")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--masters", help=argparse.SUPPRESS)
    parser.add_argument("--partitions", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    from tests.redis_cluster import RedisClusterServer

    single = start_redis()
    cluster = RedisClusterServer(tempfile.mkdtemp(prefix="shoal-bench-cluster-")).start()
    try:
        cluster_client = cluster.client()
        masters = sorted(n.port for n in cluster_client.get_primaries())
        setups = {
            "single": (single.url, [single.port], lambda: single.client().flushall()),
            "cluster": (cluster.url, masters, lambda: cluster.flushall(cluster_client)),
        }
        rows = []
        print(f"load average before: {os.getloadavg()}", flush=True)
        for partitions in PARTITION_COUNTS:
            for kind, (url, ports, flush) in setups.items():
                runs = [run(kind, url, ports, flush, partitions, args.messages) for _ in range(args.repeat)]
                figures = {key: sorted(r[key] for r in runs)[len(runs) // 2] for key in runs[0]}
                rows.append((kind, partitions, figures))
                print(f"{kind:8} N={partitions}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()),
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"load average after: {os.getloadavg()}")
        print()
        print("| Redis | partitions | publish msgs/s | consume msgs/s | client CPU µs/msg (publish / consume) "
              "| server CPU µs/msg (all masters) | busiest master µs/msg |")
        print("|---|---|---|---|---|---|---|")
        for kind, partitions, f in rows:
            print(f"| {kind} | {partitions} | {f['publish_rate']:,.0f} | {f['consume_rate']:,.0f} | "
                  f"{f['publish_client_us']:.1f} / {f['consume_client_us']:.1f} | {f['server_total_us']:.2f} | "
                  f"{f['busiest_master_us']:.2f} |")
    finally:
        single.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
