"""What Shoal's publish path costs over redis-py doing the same writes by hand.

    .venv/bin/python bench/publish.py                      # 20,000 messages per case, --repeat 3
    .venv/bin/python bench/publish.py --messages 50000 --single 10000 --repeat 5
    .venv/bin/python bench/publish.py --profile            # cProfile of publish_many and publish, no timing

Side by side on one private redis-server, the same payloads (a small order dict), the same fields
(``payload``, ``published_at``) and the same client (``get_connection()``):

- **batches**: a raw loop (per batch, a redis-py pipeline with ``transaction=False``, one XADD of
  ``json.dumps(payload)`` per message, ``execute``) vs ``publish_many(stream, batch)``, per batch size;
- **one at a time**: ``client.xadd(stream, fields)`` vs ``publish(stream, payload)``.

Every case runs --repeat times, raw and Shoal alternating (who goes first alternates too), each on a
freshly deleted stream. Printed per run: msgs/s of both and Shoal/raw (the ratio; 1.0 is no overhead),
then the median ratio per case. Wall clock: the machine is shared, so the load average is printed too.
Shoal encodes with its configured codec (``STREAMS["CODEC"]``), the raw loop with ``json.dumps``.
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

from common import setup_django, start_redis


def load():
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def make_payloads(count):
    return [{"order_id": n, "customer": "ACME Ltd", "total": "120.50", "lines": [{"sku": "A-1", "qty": 2}]}
            for n in range(count)]


def raw_many(client, stream, payloads, batch):
    for start in range(0, len(payloads), batch):
        pipe = client.pipeline(transaction=False)
        for payload in payloads[start : start + batch]:
            pipe.xadd(stream, {"payload": json.dumps(payload), "published_at": str(int(time.time() * 1000))})
        pipe.execute()


def shoal_many(client, stream, payloads, batch):
    from streams_app import publish_many

    for start in range(0, len(payloads), batch):
        publish_many(stream, payloads[start : start + batch])


def raw_one(client, stream, payloads, batch):
    for payload in payloads:
        client.xadd(stream, {"payload": json.dumps(payload), "published_at": str(int(time.time() * 1000))})


def shoal_one(client, stream, payloads, batch):
    from streams_app import publish

    for payload in payloads:
        publish(stream, payload)


def timed(fn, client, stream, payloads, batch):
    client.delete(stream)
    start = time.perf_counter()
    fn(client, stream, payloads, batch)
    took = time.perf_counter() - start
    written = client.xlen(stream)
    if written != len(payloads):
        raise AssertionError(f"{fn.__name__} wrote {written} entries, not {len(payloads)}")
    client.delete(stream)
    return len(payloads) / took


def profile(client, payloads, batch):
    for fn, size in ((shoal_many, batch), (shoal_one, 1)):
        fn(client, "bench:warm", payloads[:200], size)
        profiler = cProfile.Profile()
        profiler.enable()
        fn(client, "bench:profile", payloads, size)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(f"--- {fn.__name__}, {len(payloads)} messages (batches of {size}) ---")
        print(out.getvalue())
        client.delete("bench:warm", "bench:profile")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per batched case and run")
    parser.add_argument("--single", type=int, default=5_000, help="messages per one-at-a-time case and run")
    parser.add_argument("--batches", type=int, nargs="+", default=[100, 1000], help="publish_many batch sizes")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case, raw and Shoal alternating")
    parser.add_argument("--profile", action="store_true", help="cProfile Shoal's side instead of timing")
    args = parser.parse_args()
    os.environ.setdefault("SHOAL_TEST_STREAMS", "{}")
    server = start_redis()
    try:
        setup_django(server.url)
        from streams_app.conf import setting
        from streams_app.connection import get_connection

        client = get_connection()
        if args.profile:
            profile(client, make_payloads(min(args.messages, 5_000)), args.batches[-1])
            return
        cases = [(f"publish_many, batches of {b}", raw_many, shoal_many, args.messages, b) for b in args.batches]
        cases.append(("publish, one at a time", raw_one, shoal_one, args.single, 1))
        print(f"codec {setting('CODEC')!r}; {os.cpu_count()} CPUs; {load()}")
        for name, raw, shoal, count, batch in cases:
            payloads = make_payloads(count)
            for fn in (raw, shoal):  # warm-up: connections, caches, the stream's partition check
                fn(client, "bench:warm", payloads[:200], batch)
            client.delete("bench:warm")
            ratios = []
            print(f"\n{name}, {count:,} messages per run")
            for run in range(args.repeat):
                order = (raw, shoal) if run % 2 == 0 else (shoal, raw)
                rates = {fn: timed(fn, client, "bench:publish", payloads, batch) for fn in order}
                ratio = rates[shoal] / rates[raw]
                ratios.append(ratio)
                print(f"  run {run + 1}: raw {rates[raw]:>9,.0f} msgs/s   shoal {rates[shoal]:>9,.0f} msgs/s   "
                      f"shoal/raw {ratio:.2f}   {load()}", flush=True)
            print(f"  median shoal/raw {statistics.median(ratios):.2f} over {len(ratios)} runs")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
