"""Publish-to-handler-start latency at fixed publish rates: runconsumer vs a plain XREADGROUP BLOCK loop.

    .venv/bin/python bench/latency.py [--rates 1000 10000] [--seconds 30] [--workers 1 2]

For each rate, publishes for --seconds at that steady rate (paced every 10 ms) to a private redis-server
and reports p50 / p99 / max of (handler start - publish time), for runconsumer with each number of worker
processes and for a plain redis-py loop (XREADGROUP COUNT 500 BLOCK, one XACK per batch).
"""
import argparse
import json
import multiprocessing
import signal
import statistics
import time

from common import manage, setup_django, start_redis

STREAM, GROUP = "latency", "bench"


def plain_loop(url, stop):
    import redis

    client = redis.Redis.from_url(url)
    conn = redis.Redis.from_url(url)
    pending = []
    flushed = time.monotonic()
    while not stop.is_set():
        reply = client.xreadgroup(GROUP, "plain", {STREAM: ">"}, count=500, block=200)
        if pending and (not reply or time.monotonic() - flushed > 0.2):
            conn.rpush("bench:latency", *pending)  # recording, off the measured path
            pending, flushed = [], time.monotonic()
        if not reply:
            continue
        entries = reply[0][1]
        for _, fields in entries:
            started = time.time()
            pending.append(f"{(started - json.loads(fields[b'payload'])['t']) * 1000:.3f}")
        client.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
    if pending:
        conn.rpush("bench:latency", *pending)


def publish_at(client, rate, seconds):
    """Steady publishing: every 10 ms, as many messages as the rate owes by then."""
    start = time.monotonic()
    sent = 0
    total = int(rate * seconds)
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            pipe = client.pipeline(transaction=False)
            now = time.time()
            for _ in range(due - sent):
                pipe.xadd(STREAM, {"payload": json.dumps({"t": now})})
            pipe.execute()
            sent = due
        time.sleep(0.01 - (time.monotonic() - start) % 0.01)
    return sent


def collect(client, total, timeout=60):
    deadline = time.monotonic() + timeout
    while client.llen("bench:latency") < total and time.monotonic() < deadline:
        time.sleep(0.05)
    values = sorted(float(v) for v in client.lrange("bench:latency", 0, -1))
    if len(values) < total:
        raise RuntimeError(f"only {len(values)} of {total} latencies were recorded")
    return values


def warm_up(client, consumers):
    """Trickle messages until every consumer has shown up in the group and nothing is pending."""
    while True:
        client.xadd(STREAM, {"payload": json.dumps({"t": time.time()})})
        time.sleep(0.05)
        info = client.xinfo_groups(STREAM)[0]
        if len(client.xinfo_consumers(STREAM, GROUP)) >= consumers and info["lag"] == 0 and info["pending"] == 0:
            break
    time.sleep(0.5)  # let the recorders flush the warm-up latencies, then forget them
    client.delete("bench:latency")


def summary(values):
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {q[49]:7.2f} ms   p99 {q[98]:7.2f} ms   max {values[-1]:8.2f} ms"


def run_case(server, rate, seconds, workers):
    client = server.client()
    client.delete(STREAM, "bench:latency")
    client.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    if workers == 0:
        stop = multiprocessing.Event()
        procs = [multiprocessing.Process(target=plain_loop, args=(server.url, stop))]
        procs[0].start()
    else:
        # One worker: a plain runconsumer process. More: the supervisor with that many workers.
        pool = [] if workers == 1 else ["--workers", str(workers)]
        procs = [manage("runconsumer", f"{STREAM}:{GROUP}", *pool, "-v", "0", redis_url=server.url,
                        env={"DJANGO_SETTINGS_MODULE": "bench.settings"})]
    try:
        warm_up(client, max(workers, 1))
        total = publish_at(client, rate, seconds)
        return collect(client, total)
    finally:
        for proc in procs:
            if workers == 0:
                stop.set()
                proc.join(10)
            else:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        print(f"{'rate':>8}  {'consumer':<24}  latency publish -> handler start")
        for rate in args.rates:
            for workers in [0, *args.workers]:
                label = ("plain XREADGROUP loop" if workers == 0 else "runconsumer (1 process)" if workers == 1
                         else f"runconsumer --workers {workers}")
                values = run_case(server, rate, args.seconds, workers)
                print(f"{rate:>8}  {label:<24}  {summary(values)}   (n={len(values)})", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
