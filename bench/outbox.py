"""The transactional outbox: what ``publish(..., outbox=True)`` costs a writer, and how fast one relay drains.

    .venv/bin/python bench/outbox.py [--calls 2000] [--rows 20000] [--engine sqlite|postgres]

For each engine (SQLite: a WAL-mode file; PostgreSQL: a database of its own on SHOAL_TEST_PG,
default postgres://postgres@127.0.0.1:5432, created and dropped here), in a child process of its own:

1. the publish call alone: a direct ``publish`` (one XADD round trip) vs ``publish(..., outbox=True)``
   inside an open transaction (one INSERT), µs per call;
2. a whole write: ``atomic()`` + an Order row + outbox publish + commit (and its on_commit nudge) vs
   ``atomic()`` + an Order row + commit, then a direct publish, µs per write;
3. relay throughput: ``--rows`` rows written with ``publish_many(..., outbox=True)`` while no relay
   runs, then one relay (in this process, default OUTBOX_BATCH) drains them: rows/s from the first
   pass to an empty backlog (XADD + marking + the key-order query, each batch one pipeline).
"""
import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, start_redis


def child(engine, calls, rows):
    from django.db import transaction

    from streams_app import publish, publish_many
    from streams_app.outbox.models import OutboxMessage
    from streams_app.outbox.relay import Relay
    from tests.testapp.models import Order

    payload = {"order_id": 0, "customer": "ann", "total": 120, "lines": [{"sku": "A-1", "qty": 2}]}
    for n in range(200):  # warm-up: connections, prepared caches
        publish("warm", payload, key=f"w{n}")
        publish("warm", payload, key=f"w{n}", outbox=True)

    start = time.perf_counter()
    for n in range(calls):
        publish("direct", payload, key=f"d{n}")
    direct = (time.perf_counter() - start) / calls

    inside = 0.0
    with transaction.atomic():
        for n in range(calls):
            t = time.perf_counter()
            publish("outboxed", payload, key=f"o{n}", outbox=True)
            inside += time.perf_counter() - t
    inside /= calls

    start = time.perf_counter()
    for n in range(calls):
        with transaction.atomic():
            Order.objects.create(name=f"out-{n}")
            publish("outboxed", payload, key=f"order-{n}", outbox=True)
    write_outbox = (time.perf_counter() - start) / calls

    start = time.perf_counter()
    for n in range(calls):
        with transaction.atomic():
            Order.objects.create(name=f"direct-{n}")
        publish("direct", payload, key=f"order-{n}")
    write_direct = (time.perf_counter() - start) / calls

    relay = Relay("default")
    while relay.tick():
        pass
    OutboxMessage.objects.all().delete()
    for start_at in range(0, rows, 1000):
        publish_many("relayed", [payload] * 1000, keys=[f"k{(start_at + i) % 100}" for i in range(1000)], outbox=True)
    start = time.perf_counter()
    while relay.tick():
        pass
    drained = time.perf_counter() - start
    relay.guard.release()
    assert OutboxMessage.objects.filter(relayed_at__isnull=True).count() == 0
    assert relay.redis.xlen("relayed") == rows
    print(json.dumps({"engine": engine, "direct_us": direct * 1e6, "outbox_us": inside * 1e6,
                      "write_outbox_us": write_outbox * 1e6, "write_direct_us": write_direct * 1e6,
                      "relay_rows_s": rows / drained, "rows": rows}))


def run_engine(engine, calls, rows, redis_url):
    from tests.databases import PostgresDatabase, SqliteDatabase

    database = (SqliteDatabase(Path(tempfile.mkdtemp(prefix="shoal-bench-")) / "outbox.sqlite3") if engine == "sqlite"
                else PostgresDatabase())
    database.create()
    try:
        if engine == "sqlite":
            with sqlite3.connect(database.path) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        env = {**os.environ, "DATABASE_URL": database.url, "REDIS_URL": redis_url,
               "DJANGO_SETTINGS_MODULE": "tests.settings"}
        done = subprocess.run([sys.executable, __file__, "--child", engine, "--calls", str(calls), "--rows", str(rows)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise SystemExit(f"{engine}: {done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        database.drop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--engine", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        import django

        django.setup()
        child(args.child, args.calls, args.rows)
        return
    server = start_redis()
    try:
        for engine in args.engine or ["sqlite", "postgres"]:
            server.client().flushall()
            r = run_engine(engine, args.calls, args.rows, server.url)
            print(f"{engine:9} publish call: direct {r['direct_us']:6.0f} µs, outbox inside a transaction "
                  f"{r['outbox_us']:6.0f} µs | whole write (row + event + commit): outbox {r['write_outbox_us']:6.0f} µs, "
                  f"commit then direct {r['write_direct_us']:6.0f} µs | one relay: {r['relay_rows_s']:7.0f} rows/s "
                  f"({r['rows']} rows)", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
