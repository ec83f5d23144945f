"""What Shoal's publish path costs over redis-py doing the same writes by hand.

    .venv/bin/python bench/publish.py                      # 20,000 messages per case, --repeat 3
    .venv/bin/python bench/publish.py --messages 50000 --single 10000 --repeat 5
    .venv/bin/python bench/publish.py --profile            # cProfile of publish_many and publish, no timing

Side by side on one private redis-server, the same payloads (a small order dict), the same fields
(``payload``, ``published_at``) and the same client (``get_connection()``):

- **batches**: a raw loop (per batch, a redis-py pipeline with ``transaction=False``, one XADD of
  ``json.dumps(payload)`` per message, ``execute``) vs ``publish_many(stream, batch)``, per batch size;
- **one at a time**: ``client.xadd(stream, fields)`` vs ``publish(stream, payload)``.

Every case runs --repeat times. Within a run raw and Shoal take turns every --slice messages (who
goes first alternates), each slice on a freshly deleted stream, so that both meet the same moments of
a shared machine's load. Printed per run: msgs/s of both and Shoal/raw (the ratio; 1.0 is no
overhead), and the CPU time this process spent per message (raw's / Shoal's: the same ratio by CPU,
which the other processes on the machine disturb less); then the medians per case, with the load
average. Shoal encodes with its configured codec (``STREAMS["CODEC"]``), the raw loop with ``json.dumps``.
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

from common import positive, setup_django, start_redis


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
    """(wall seconds, CPU seconds of this process) of ``fn`` writing ``payloads`` to an empty stream."""
    client.delete(stream)
    start, cpu = time.perf_counter(), time.process_time()
    fn(client, stream, payloads, batch)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    written = client.xlen(stream)
    if written != len(payloads):
        raise AssertionError(f"{fn.__name__} wrote {written} entries, not {len(payloads)}")
    client.delete(stream)
    return took, cpu


def one_run(raw, shoal, client, payloads, batch, slice_size, first):
    """Raw and Shoal take turns slice by slice, so that both meet the same moments of a shared machine's load.

    Returns {fn: (msgs/s, CPU µs per message)}.
    """
    wall, cpu = {raw: 0.0, shoal: 0.0}, {raw: 0.0, shoal: 0.0}
    for n, start in enumerate(range(0, len(payloads), slice_size)):
        chunk = payloads[start : start + slice_size]
        order = (raw, shoal) if (n + first) % 2 == 0 else (shoal, raw)
        for fn in order:
            took, spent = timed(fn, client, "bench:publish", chunk, batch)
            wall[fn] += took
            cpu[fn] += spent
    return {fn: (len(payloads) / wall[fn], cpu[fn] / len(payloads) * 1e6) for fn in (raw, shoal)}


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
    parser.add_argument("--messages", type=positive, default=20_000, help="messages per batched case and run")
    parser.add_argument("--single", type=positive, default=5_000, help="messages per one-at-a-time case and run")
    parser.add_argument("--batches", type=positive, nargs="+", default=[100, 1000], help="publish_many batch sizes")
    parser.add_argument("--repeat", type=positive, default=3, help="runs per case, raw and Shoal alternating")
    parser.add_argument("--slice", type=positive, default=2_000, help="messages raw or Shoal sends before the other's turn (a quarter of it one at a time)")
    parser.add_argument("--profile", action="store_true", help="cProfile Shoal's side instead of timing")
    args = parser.parse_args()
    os.environ.setdefault("SHOAL_TEST_STREAMS", "{}")
    server = start_redis()
    try:
        setup_django(server.url)
        from streams_app.conf import setting
        from streams_app.redis.connection import get_connection

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
            # One at a time is ~5x slower per message: a quarter of the slice takes turns as often.
            slice_size = max(batch, args.slice // batch * batch) if batch > 1 else max(1, args.slice // 4)
            ratios, cpu_ratios = [], []
            print(f"\n{name}, {count:,} messages per run, raw and Shoal alternating every {slice_size:,}")
            for run in range(args.repeat):
                got = one_run(raw, shoal, client, payloads, batch, slice_size, run)
                (raw_rate, raw_cpu), (shoal_rate, shoal_cpu) = got[raw], got[shoal]
                ratios.append(shoal_rate / raw_rate)
                cpu_ratios.append(raw_cpu / shoal_cpu)
                print(f"  run {run + 1}: raw {raw_rate:>9,.0f} msgs/s {raw_cpu:6.2f} µs CPU/msg   shoal {shoal_rate:>9,.0f} "
                      f"msgs/s {shoal_cpu:6.2f} µs CPU/msg   shoal/raw {ratios[-1]:.2f} (CPU {cpu_ratios[-1]:.2f})   "
                      f"{load()}", flush=True)
            print(f"  median shoal/raw {statistics.median(ratios):.2f} (by CPU per message "
                  f"{statistics.median(cpu_ratios):.2f}) over {len(ratios)} runs")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
