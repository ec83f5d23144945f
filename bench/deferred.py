"""How late deferred messages start, and what moving them costs (streams_app/publishing/scheduled.py).

    .venv/bin/python bench/deferred.py [--workers 1 2] [--count 2000] [--burst 20000]

Against a private redis-server, ``runconsumer deferred:g --workers W`` (tests/testapp: the handler
records when it started). Lateness is handler start (host clock) minus the message's due time (Redis
clock; same host). Three loads per worker count:

- ``spread``: --count messages published at a steady 200/s, each due 0.2-5 s after its publish
  (most are due well after the mover last looked: it wakes for the head of the set);
- ``short``: --count messages due 0-1 s after their publish, published at 200/s (below the
  poll interval: the head may be published after the mover looked);
- ``burst``: --burst messages all due at one instant (how fast the backlog is moved and handled).

Then the idle cost: move-script calls per second and Redis CPU over 10 s with nothing scheduled.
"""
import argparse
import json
import random
import signal
import subprocess
import time
from datetime import timedelta

from common import manage, setup_django, start_redis

STREAM = "deferred"


def percentiles(values):
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return f"p50 {pick(0.5):7.0f}  p90 {pick(0.9):7.0f}  p99 {pick(0.99):7.0f}  max {values[-1]:7.0f} ms"


def wait_runs(client, total, timeout=300):
    deadline = time.monotonic() + timeout
    while client.llen("deferred:runs") < total:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {client.llen('deferred:runs')} of {total} deferred messages ran")
        time.sleep(0.05)
    runs = [json.loads(r) for r in client.lrange("deferred:runs", 0, -1)]
    client.delete("deferred:runs")
    return runs


def trickle(count, delays, rate=200):
    from streams_app import publish

    start = time.monotonic()
    for n in range(count):
        publish(STREAM, {"n": n}, key=f"k{n}", run_after=timedelta(seconds=delays()))
        time.sleep(max(0.0, start + (n + 1) / rate - time.monotonic()))


def burst(count, client):
    """Publish ``count`` messages due at one instant; seconds from that instant until all were moved."""
    from streams_app import publish_many
    from streams_app.redis.keys import scheduled_key

    due = time.time() + 3 + count / 20000  # scheduled in full before it is due
    publish_many(STREAM, [{"n": n} for n in range(count)], keys=[f"b{n}" for n in range(count)],
                 run_after=timedelta(seconds=due - time.time()))
    while client.zcard(scheduled_key(STREAM)):
        time.sleep(0.005)
    return time.time() - due


def idle_cost(client, seconds=10):
    def stats():
        info = client.info("commandstats")
        calls = sum(v["calls"] for k, v in info.items() if k.startswith("cmdstat_evalsha"))
        cpu = client.info("cpu")
        return calls, cpu["used_cpu_user"] + cpu["used_cpu_sys"]

    calls0, cpu0 = stats()
    time.sleep(seconds)
    calls1, cpu1 = stats()
    return (calls1 - calls0) / seconds, (cpu1 - cpu0) / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--burst", type=int, default=20000)
    args = parser.parse_args()
    server = start_redis()
    setup_django(server.url)
    client = server.client()
    rng = random.Random(29)
    try:
        for workers in args.workers:
            client.flushall()
            proc = manage("runconsumer", f"{STREAM}:g", "--workers", str(workers), redis_url=server.url,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 60
                while len(client.xinfo_groups(STREAM) if client.exists(STREAM) else []) == 0:
                    client.xadd(STREAM, {"payload": "{}"})  # warm up: the group exists, workers read
                    time.sleep(0.2)
                    if time.monotonic() > deadline:
                        raise RuntimeError("runconsumer did not start")
                time.sleep(2)
                client.delete("deferred:runs")
                print(f"--workers {workers}")
                trickle(args.count, lambda: rng.uniform(0.2, 5.0))
                runs = wait_runs(client, args.count)
                print(f"  spread  {len(runs):6d} msgs  lateness {percentiles([r['at'] - r['due'] for r in runs])}")
                trickle(args.count, lambda: rng.uniform(0.0, 1.0))
                runs = wait_runs(client, args.count)
                print(f"  short   {len(runs):6d} msgs  lateness {percentiles([r['at'] - r['due'] for r in runs])}")
                moved_in = burst(args.burst, client)
                runs = wait_runs(client, args.burst)
                late = [r["at"] - r["due"] for r in runs]
                print(f"  burst   {len(runs):6d} msgs  lateness {percentiles(late)}  (all moved {moved_in:.2f} s "
                      f"after their time: {args.burst / moved_in:,.0f}/s; handled {args.burst / (max(late) / 1000):,.0f}/s)")
                calls, cpu = idle_cost(client)
                print(f"  idle    {calls:.1f} script calls/s (moves, liveness beats), Redis CPU {cpu * 1000:.2f} ms/s")
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
