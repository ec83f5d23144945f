"""Realistic handlers: a 1 ms I/O wait, 1 ms of Python computing and one Django ORM row on PostgreSQL,
against a plain sequential loop.

    .venv/bin/python bench/realistic.py            # quick default: 3,000 messages + 4 s at 100/s per row, ~7 min in all
    .venv/bin/python bench/realistic.py --messages 20000 --seconds 10 --rate 300
    .venv/bin/python bench/realistic.py --handlers cpu --threads 1 4      # one handler, fewer rows

Three handlers (bench/benchapp/consumers.py): ``sleep`` waits 1 ms (``time.sleep(0.001)``, a call to
another service); ``cpu`` computes for about 1 ms in pure Python (holding the GIL, as parsing or
scoring would); ``orm`` inserts one row with the ORM (``Effect.objects.create``, autocommit) into a
PostgreSQL database created for the run on 127.0.0.1:5432 and dropped at the end (skipped, with a
message, when no server answers). Each handler runs as a plain sequential loop (XREADGROUP COUNT 500
BLOCK, the same work per entry, one XACK per read) and as ``runconsumer`` with ``--threads`` 1, 4, 16
times ``--workers`` 1, 2 (``--workers 1`` is one process without the supervisor; 2 is the supervisor
and two worker processes). Every row has a fresh stream and a private redis-server behind it.

Per row: (1) msgs/s: N messages published at once, from the first publish to the last handler done
(each handler records its message's publish time and its own done time); (2) latency: messages
published at a steady --rate for --seconds (every 10 ms), p50/p99 of publish-to-handler-done. The
figures are printed with the load average (the machine is shared: read them with it).
"""
import argparse
import multiprocessing
import os
import signal
import statistics
import time

from common import ROOT, manage, setup_django, start_redis

GROUP = "bench"
HANDLERS = {"sleep": "real_sleep", "cpu": "real_cpu", "orm": "real_orm"}


def load():
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def plain_loop(url, stream, kind, stop):
    """What any consumer pays at least: read, do the work, record, ack, one entry after the other."""
    import orjson
    import redis
    from django.db import connections

    from bench.benchapp.consumers import cpu_work, io_wait_work, orm_work

    connections.close_all()  # never the parent's connection after fork
    work = {"sleep": io_wait_work, "cpu": cpu_work, "orm": orm_work}[kind]
    client = redis.Redis.from_url(url)
    while not stop.is_set():
        reply = client.xreadgroup(GROUP, "plain", {stream: ">"}, count=500, block=100)
        if not reply:
            continue
        entries = reply[0][1]
        done = []
        for _, fields in entries:
            payload = orjson.loads(fields[b"payload"])
            work(payload)
            done.append(f"{payload['t']:.6f} {time.time():.6f}")
        client.rpush("bench:done", *done)
        client.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])


def publish(stream, start, count):
    from streams_app import publish_many

    now = time.time()
    publish_many(stream, [{"n": n, "t": now} for n in range(start, start + count)])


def warm_up(client, stream, consumers, timeout=120):
    """Trickle messages until every consumer has shown up and all were handled; then forget their records."""
    deadline = time.monotonic() + timeout
    sent = 0
    while time.monotonic() < deadline:
        publish(stream, -1 - sent, 1)
        sent += 1
        time.sleep(0.05)
        if len(client.xinfo_consumers(stream, GROUP)) >= consumers and client.llen("bench:done") >= sent:
            client.delete("bench:done")
            return
    raise TimeoutError(f"{consumers} consumer(s) did not start on {stream} within {timeout}s "
                       f"({len(client.xinfo_consumers(stream, GROUP))} read, {client.llen('bench:done')} of {sent} "
                       f"handled, group {client.xinfo_groups(stream)})")


def collect(client, total, timeout=300):
    deadline = time.monotonic() + timeout
    while client.llen("bench:done") < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {client.llen('bench:done')} of {total} messages were handled in {timeout}s")
        time.sleep(0.02)
    pairs = [tuple(map(float, v.split())) for v in client.lrange("bench:done", 0, -1)]
    client.delete("bench:done")
    return pairs


def throughput(client, stream, total):
    for start in range(0, total, 5_000):
        publish(stream, start, min(5_000, total - start))
    pairs = collect(client, total)
    return total / (max(done for _, done in pairs) - min(pub for pub, _ in pairs))


def latencies(client, stream, rate, seconds):
    """Steady publishing: every 10 ms, as many messages as the rate owes by then."""
    start = time.monotonic()
    sent, total = 0, int(rate * seconds)
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            publish(stream, 1_000_000 + sent, due - sent)
            sent = due
        time.sleep(0.01 - (time.monotonic() - start) % 0.01)
    values = sorted((done - pub) * 1000 for pub, done in collect(client, total))
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[49], q[98]


def run_row(server, kind, threads, workers, args, db_url):
    """(msgs/s, p50 ms, p99 ms) of one configuration; threads None is the plain loop."""
    stream = HANDLERS[kind]
    client = server.client()
    client.delete(stream, "bench:done")
    client.xgroup_create(stream, GROUP, id="$", mkstream=True)
    env = {"DJANGO_SETTINGS_MODULE": "bench.settings", **({"DATABASE_URL": db_url} if db_url else {})}
    if threads is None:
        stop = multiprocessing.Event()
        proc = multiprocessing.Process(target=plain_loop, args=(server.url, stream, kind, stop))
        proc.start()
    else:
        pool = [] if workers == 1 else ["--workers", str(workers)]
        proc = manage("runconsumer", f"{stream}:{GROUP}", "--threads", str(threads), *pool, "-v", "0",
                      redis_url=server.url, env=env)
    try:
        warm_up(client, stream, 1 if threads is None else workers)
        rate = throughput(client, stream, args.messages)
        p50, p99 = latencies(client, stream, args.rate, args.seconds)
        return rate, p50, p99
    finally:
        if threads is None:
            stop.set()
            proc.join(30)
        else:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def postgres():
    """A database for the run on the local server, or None (and why) when there is none."""
    import sys

    sys.path.insert(0, str(ROOT))
    from tests.databases import PostgresDatabase, PostgresUnavailable

    db = PostgresDatabase(name=f"shoal_bench_{os.getpid()}")
    try:
        return db.create(), None
    except PostgresUnavailable as exc:
        return None, str(exc)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=3_000, help="messages per throughput run")
    parser.add_argument("--rate", type=int, default=100, help="msgs/s offered during the latency run")
    parser.add_argument("--seconds", type=float, default=4, help="length of the latency run")
    parser.add_argument("--handlers", nargs="+", choices=sorted(HANDLERS), default=["sleep", "cpu", "orm"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="the default sizes (a few minutes in all)")
    parser.add_argument("--full", action="store_true", help="20,000 messages, 10 s at 300 msgs/s per row")
    args = parser.parse_args()
    if args.full:
        args.messages, args.seconds, args.rate = 20_000, 10, 300
    db, why = (None, None)
    if "orm" in args.handlers:
        db, why = postgres()
        if db is None:
            print(f"skipping the ORM handler: {why}")
            args.handlers.remove("orm")
    if db:
        os.environ["DATABASE_URL"] = db.url
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        print(f"{args.messages} messages per throughput run; latency at {args.rate} msgs/s for {args.seconds:g} s; "
              f"{os.cpu_count()} CPUs; {load()}")
        print(f"{'handler':<7} {'consumer':<32} {'msgs/s':>8} {'p50 ms':>8} {'p99 ms':>8}   load average 1/5/15 min")
        for kind in args.handlers:
            rows = [(None, 1)] + [(t, w) for w in args.workers for t in args.threads]
            for threads, workers in rows:
                label = ("plain sequential loop" if threads is None
                         else f"runconsumer --threads {threads}" + (f" --workers {workers}" if workers > 1 else ""))
                rate, p50, p99 = run_row(server, kind, threads, workers, args, db.url if db else None)
                # Below the offered rate the latency run measures a growing queue, not the consumer.
                mark = " (saturated: slower than --rate)" if rate < args.rate * 1.1 else ""
                print(f"{kind:<7} {label:<32} {rate:>8,.0f} {p50:>8.2f} {p99:>8.2f}   {load()}{mark}", flush=True)
    finally:
        server.stop()
        if db:
            from django.db import connections

            connections.close_all()
            db.drop()


if __name__ == "__main__":
    main()
