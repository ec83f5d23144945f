"""Throughput of runconsumer against a plain redis-py loop, in one run on one private Redis.

    .venv/bin/python bench/throughput.py [--messages 200000] [--repeat 3] [--workers 2] [--codec orjson] [--typed]

(a) plain: XREADGROUP COUNT 500, json.loads per entry, one XACK per batch (the floor any Python
consumer pays); (b) runconsumer with a no-op handler and default settings, one process; (c) with
--workers N > 1, the supervisor (runconsumer --workers N) on the same entries, read again by a
fresh group. All are timed from outside the same way: first entry read by the group to last entry acked.
--codec sets STREAMS["CODEC"] for the publisher and the consumers; --typed adds a datetime, a Decimal
and a UUID to each payload (the plain loop still only parses the JSON). --repeat N alternates (a) and
(b) N times (plain, runconsumer, plain, runconsumer, ...), each on a fresh group, and prints each pair's
ratio and the median: on a shared machine one pair says little.
"""
import argparse
import datetime
import decimal
import json
import multiprocessing
import os
import signal
import statistics
import uuid

from common import manage, setup_django, start_redis, time_consumption


def plain_loop(url, stream, group, total):
    import redis

    client = redis.Redis.from_url(url)
    client.xgroup_create(stream, group, id="0")  # the caller destroyed any earlier one
    done = 0
    while done < total:
        reply = client.xreadgroup(group, "plain", {stream: ">"}, count=500, block=1000)
        if not reply:
            continue
        entries = reply[0][1]
        for _, fields in entries:
            json.loads(fields[b"payload"])
        client.xack(stream, group, *[entry_id for entry_id, _ in entries])
        done += len(entries)


def payload(n, typed):
    if not typed:
        return {"n": n, "pad": "x" * 40}
    return {"n": n, "at": datetime.datetime.now(datetime.UTC), "total": decimal.Decimal("9.99"), "id": uuid.uuid4()}


def publish(total, stream, typed=False):
    from streams_app import publish_many

    for start in range(0, total, 10_000):
        publish_many(stream, [payload(n, typed) for n in range(start, min(total, start + 10_000))])


def run_consumer(client, url, total, *options):
    """Seconds ``runconsumer noop:bench [options]`` takes to consume ``total`` entries; then TERM it."""
    proc = manage("runconsumer", "noop:bench", "-v", "0", *options, redis_url=url)
    try:
        # One process: its CPU time too (with --workers N the work is in the children).
        return time_consumption(client, "noop", "bench", total, pid=None if options else proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def fresh_group(client, stream, group):
    """Forget ``group`` (if a previous run made it), so the next consumer reads every entry again."""
    if any(info["name"] in (group, group.encode()) for info in client.xinfo_groups(stream)):
        client.xgroup_destroy(stream, group)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def pair(client, url, total, label=""):
    """(a) then (b) on fresh groups; prints both and their ratio; returns (plain rate, runconsumer rate)."""
    fresh_group(client, "noop", "plain")
    proc = multiprocessing.Process(target=plain_loop, args=(url, "noop", "plain", total))
    proc.start()
    plain, plain_cpu = time_consumption(client, "noop", "plain", total, pid=proc.pid)
    proc.join()
    plain_rate = total / plain
    print(f"{label}(a) plain redis-py loop:      {plain_rate:>10,.0f} msgs/s  ({plain:.2f} s)"
          f"  CPU {plain_cpu / total * 1e6:.2f} µs/msg  load {loadavg()}")

    fresh_group(client, "noop", "bench")
    one, one_cpu = run_consumer(client, url, total)
    one_rate = total / one
    print(f"{label}{'(b) runconsumer, 1 process:':<30}{one_rate:>10,.0f} msgs/s  ({one:.2f} s)"
          f"  CPU {one_cpu / total * 1e6:.2f} µs/msg  load {loadavg()}")
    print(f"{label}ratio b/a: {one_rate / plain_rate:.2f}  (CPU per message a/b: {plain_cpu / one_cpu:.2f})")
    return plain_rate, one_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=1,
                        help="with N > 1, also time the supervisor with N worker processes (runconsumer --workers N)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="alternate (a) and (b) N times and print the median ratio b/a")
    parser.add_argument("--codec", help="STREAMS['CODEC'] of the publisher and the consumers (default: the setting's)")
    parser.add_argument("--typed", action="store_true", help="payloads with a datetime, a Decimal and a UUID")
    args = parser.parse_args()
    if args.codec:
        os.environ["SHOAL_TEST_STREAMS"] = json.dumps({"CODEC": args.codec})  # tests.settings reads it, here and in runconsumer
    server = start_redis()
    try:
        setup_django(server.url)
        client = server.client()
        publish(args.messages, "noop", args.typed)
        kind = "typed " if args.typed else ""
        print(f"published {args.messages} {kind}messages with codec {args.codec or 'default'} to a private redis-server on port {server.port}")

        ratios = []
        for run in range(1, args.repeat + 1):
            label = f"run {run}/{args.repeat} " if args.repeat > 1 else ""
            plain_rate, one_rate = pair(client, server.url, args.messages, label)
            ratios.append(one_rate / plain_rate)
        if args.repeat > 1:
            print(f"ratios b/a: {' '.join(f'{r:.2f}' for r in ratios)}  median {statistics.median(ratios):.2f}")
        if args.workers > 1:
            client.xgroup_destroy("noop", "bench")  # the same entries again, for a fresh group
            pool = run_consumer(client, server.url, args.messages, "--workers", str(args.workers))
            pool_rate = args.messages / pool
            label = f"(c) runconsumer --workers {args.workers}:"
            print(f"{label:<30}{pool_rate:>10,.0f} msgs/s  ({pool:.2f} s)")
            print(f"ratio c/b ({args.workers} workers / 1): {pool_rate / one_rate:.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
