"""Handlers that wait on I/O (1 ms by default): sync ones on handler threads, async ones on the event loop.

    .venv/bin/python bench/io_wait.py [--messages 20000] [--wait-ms 1]

Publishes N messages once; each run is a group (rewound for the next run) of one ``runconsumer`` process reading all N,
timed from outside from the first entry read to the last one acked (bench/common.py). A sync handler
doing ``time.sleep(wait)`` is bounded by its threads (at best threads/wait); an ``async def`` doing
``await asyncio.sleep(wait)`` by ``--concurrency`` and by the cost of one coroutine per message.
"""
import argparse
import signal

from common import manage, setup_django, start_redis, time_consumption

RUNS = [
    ("sync", ["--threads", "4"], "sync def, --threads 4 (default)"),
    ("sync", ["--threads", "32"], "sync def, --threads 32"),
    ("async", ["--concurrency", "100"], "async def, --concurrency 100 (default)"),
    ("async", ["--concurrency", "500"], "async def, --concurrency 500"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--wait-ms", type=float, default=1.0, help="how long each handler waits on I/O")
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        from streams_app import publish_many

        client = server.client()
        wait = args.wait_ms / 1000
        for start in range(0, args.messages, 10_000):
            publish_many("iowait", [{"n": n, "wait": wait} for n in range(start, min(args.messages, start + 10_000))])
        print(f"published {args.messages} messages (handlers wait {args.wait_ms:g} ms) to a private redis-server "
              f"on port {server.port}")
        for group, options, label in RUNS:
            # The same entries again: the group rewound, not destroyed (a destroyed group that comes back is
            # a lost group to runconsumer, which holds its reads for the settling time: docs/failures.md).
            if any(g["name"] == group for g in client.xinfo_groups("iowait")):
                client.xgroup_setid("iowait", group, "0", entries_read=0)
            else:
                client.xgroup_create("iowait", group, id="0")
            proc = manage("runconsumer", f"iowait:{group}", "-v", "0", *options, redis_url=server.url,
                          env={"DJANGO_SETTINGS_MODULE": "bench.settings"})
            try:
                seconds = time_consumption(client, "iowait", group, args.messages)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            print(f"{label:<42}{args.messages / seconds:>10,.0f} msgs/s  ({seconds:.2f} s)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
