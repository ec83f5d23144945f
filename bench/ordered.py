"""Ordered mode against the default (shared) mode: one runconsumer process, a no-op handler.

    .venv/bin/python bench/ordered.py [--messages 20000] [--partitions 4]

Publishes keyed messages to a partitioned stream on a private redis-server, then times one runconsumer
process draining it with group ``shared`` (every partition read, chunks on several threads), then with
group ``ordered`` (``ordered=True``: leases, fenced scripts, one message at a time per partition).
Timed from outside: first entry read by the group to the last one acked over every partition.
"""
import argparse
import json
import os
import signal
import time

from common import cpu_seconds, group_progress, manage, setup_django, start_redis


def drain_seconds(client, names, group, total, pid, timeout=600):
    deadline = time.monotonic() + timeout
    start = cpu_start = None
    while time.monotonic() < deadline:
        read = pending = 0
        for name in names:
            r, p = group_progress(client, name, group)
            read, pending = read + r, pending + p
        now = time.monotonic()
        if start is None and read > 0:
            start, cpu_start = now, cpu_seconds(pid)
        if read >= total and pending == 0:
            return now - start, cpu_seconds(pid) - cpu_start
        time.sleep(0.005)
    raise TimeoutError(f"{group} did not consume {total} entries in {timeout}s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    os.environ["SHOAL_TEST_STREAMS"] = json.dumps({"PARTITIONS": {"ordbench": args.partitions}})
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        from streams_app import publish_many
        from streams_app.partitioning import partitions

        client = server.client()
        for start in range(0, args.messages, 5000):
            count = min(5000, args.messages - start)
            publish_many("ordbench", [{"n": n} for n in range(start, start + count)],
                         keys=[f"key-{n % 100}" for n in range(start, start + count)])
        names = partitions.names("ordbench")
        print(f"published {args.messages} keyed messages over {len(names)} partitions (port {server.port})")
        rates = {}
        for group in ("shared", "ordered"):
            proc = manage("runconsumer", f"ordbench:{group}", "-v", "0", redis_url=server.url,
                          env={"DJANGO_SETTINGS_MODULE": "bench.settings"})
            try:
                seconds, cpu = drain_seconds(client, names, group, args.messages, proc.pid)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            rates[group] = args.messages / seconds
            print(f"{group:>8}: {rates[group]:>9,.0f} msgs/s ({seconds:.2f} s)  CPU {cpu / args.messages * 1e6:.1f} µs/msg")
        print(f"ordered / shared: {rates['ordered'] / rates['shared']:.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
