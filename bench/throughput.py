"""Throughput of runconsumer against a plain redis-py loop, in one run on one private Redis.

    .venv/bin/python bench/throughput.py [--messages 200000] [--workers 2]

(a) plain: XREADGROUP COUNT 500, json.loads per entry, one XACK per batch (the floor any Python
consumer pays); (b) runconsumer with a no-op handler and default settings, one process; (c) with
--workers N > 1, the supervisor (runconsumer --workers N) on the same entries, read again by a
fresh group. All are timed from outside the same way: first entry read by the group to last entry acked.
"""
import argparse
import json
import multiprocessing
import signal

from common import manage, setup_django, start_redis, time_consumption


def plain_loop(url, stream, group, total):
    import redis

    client = redis.Redis.from_url(url)
    client.xgroup_create(stream, group, id="0")
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


def publish(total, stream):
    from streams_app import publish_many

    for start in range(0, total, 10_000):
        publish_many(stream, [{"n": n, "pad": "x" * 40} for n in range(start, min(total, start + 10_000))])


def run_consumer(client, url, total, *options):
    """Seconds ``runconsumer noop:bench [options]`` takes to consume ``total`` entries; then TERM it."""
    proc = manage("runconsumer", "noop:bench", "-v", "0", *options, redis_url=url)
    try:
        return time_consumption(client, "noop", "bench", total)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=1,
                        help="with N > 1, also time the supervisor with N worker processes (runconsumer --workers N)")
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url)
        client = server.client()
        publish(args.messages, "noop")
        print(f"published {args.messages} messages to a private redis-server on port {server.port}")

        proc = multiprocessing.Process(target=plain_loop, args=(server.url, "noop", "plain", args.messages))
        proc.start()
        plain = time_consumption(client, "noop", "plain", args.messages)
        proc.join()
        plain_rate = args.messages / plain
        print(f"(a) plain redis-py loop:      {plain_rate:>10,.0f} msgs/s  ({plain:.2f} s)")

        one = run_consumer(client, server.url, args.messages)
        one_rate = args.messages / one
        print(f"{'(b) runconsumer, 1 process:':<30}{one_rate:>10,.0f} msgs/s  ({one:.2f} s)")
        print(f"ratio b/a: {one_rate / plain_rate:.2f}")
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
