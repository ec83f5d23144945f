"""Handlers that wait 1 ms on I/O: sync ones on handler threads against async ones on the event loop.

    .venv/bin/python bench/io_wait.py [--messages 20000]

Publishes N messages once; each run is a fresh group of one ``runconsumer`` process reading all N,
timed from outside from the first entry read to the last one acked (bench/common.py). A sync handler
doing ``time.sleep(0.001)`` is bounded by its threads (at best threads/1 ms); an ``async def`` doing
``await asyncio.sleep(0.001)`` by ``--concurrency`` and by the cost of one coroutine per message.
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
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        from streams_app import publish_many

        client = server.client()
        for start in range(0, args.messages, 10_000):
            publish_many("iowait", [{"n": n} for n in range(start, min(args.messages, start + 10_000))])
        print(f"published {args.messages} messages to a private redis-server on port {server.port}")
        for group, options, label in RUNS:
            try:
                client.xgroup_destroy("iowait", group)  # the same entries again, for a fresh group
            except Exception:
                pass
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
