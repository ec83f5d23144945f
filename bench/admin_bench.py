"""The control room under load: copying dead letters into the admin's mirror, and the pending page.

    .venv/bin/python bench/admin_bench.py [--dead-letters 20000] [--pending 100000]

(a) sync of N dead letters: the first copy, then a sync with nothing new, then one with 100 new
(incremental: reads past the cursor only); (b) the whole pending-entries admin page (test client,
superuser) with P entries pending, first page and a page in the middle, and the Redis commands
one page costs. Uses a private redis-server and a throw-away SQLite database.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

from common import setup_django, start_redis


def timed(fn, repeat=1):
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def fill_dead_letters(client, stream, count, start=0):
    pipe = client.pipeline(transaction=False)
    for n in range(start, start + count):
        pipe.xadd(f"{{{stream}}}:dlq", {
            "payload": json.dumps({"order": n, "sku": None}), "shoal:origin_stream": stream, "shoal:origin_id": f"1-{n}",
            "shoal:group": "email", "shoal:consumer": "bench", "shoal:deliveries": "5", "shoal:error": "KeyError: 'sku'",
            "shoal:traceback": "Traceback (most recent call last):\n  ...\nKeyError: 'sku'", "shoal:failed_at": str(int(time.time() * 1000)),
        })
        if n % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dead-letters", type=int, default=20_000, help="dead letters to copy")
    parser.add_argument("--pending", type=int, default=100_000, help="entries pending in the group")
    args = parser.parse_args()

    server = start_redis()
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='shoal-bench-db-')}/db.sqlite3"
    try:
        setup_django(server.url)
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client
        from django.test.utils import setup_test_environment

        from django.utils import timezone

        from streams_app.admin import mirror
        from streams_app.models import ConsumerGroup, Stream

        setup_test_environment()  # the test client's host name
        call_command("migrate", verbosity=0)
        client = server.client()

        fill_dead_letters(client, "orders", args.dead_letters)
        stream = Stream.objects.create(name="orders", synced_at=timezone.now())
        first = timed(lambda: mirror.sync_dead_letters(stream))
        idle = timed(lambda: mirror.sync_dead_letters(stream), repeat=5)
        fill_dead_letters(client, "orders", 100, start=args.dead_letters)
        more = timed(lambda: mirror.sync_dead_letters(stream))
        print(f"dead letters: first copy of {args.dead_letters:,}: {first:.2f} s "
              f"({args.dead_letters / first:,.0f}/s); sync with none new: {idle * 1000:.1f} ms; "
              f"with 100 new: {more * 1000:.1f} ms")

        pipe = client.pipeline(transaction=False)
        for n in range(args.pending):
            pipe.xadd("jobs", {"payload": json.dumps({"n": n})})
            if n % 10_000 == 9_999:
                pipe.execute()
        pipe.execute()
        client.xgroup_create("jobs", "a", id="0")
        client.xreadgroup("a", "c1", {"jobs": ">"}, count=args.pending)
        synced = timed(lambda: mirror.sync_streams())
        group = ConsumerGroup.objects.get(stream__name="jobs", name="a")
        User.objects.create_superuser("bench", password="bench")
        web = Client()
        web.force_login(User.objects.get(username="bench"))
        url = f"/admin/streams_app/consumergroup/{group.pk}/pending/"
        middle = client.xrange("jobs", count=args.pending // 2)[-1][0]
        client.config_resetstat()
        web.get(url)
        calls = sum(v["calls"] for v in client.info("commandstats").values())
        first_page = timed(lambda: web.get(url), repeat=5)
        middle_page = timed(lambda: web.get(url, {"after": middle}), repeat=5)
        print(f"pending page with {args.pending:,} pending: first page {first_page * 1000:.1f} ms, "
              f"page after entry {args.pending // 2:,} {middle_page * 1000:.1f} ms, {calls} Redis commands for one page "
              f"(50 of them one pipelined XRANGE batch); sync_streams (all groups, stale-pending count) {synced * 1000:.1f} ms")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
