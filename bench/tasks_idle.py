"""What an idle Tasks worker costs: CPU of the runconsumer process and Redis commands per second.

    .venv/bin/python bench/tasks_idle.py [--queues 4] [--seconds 10] [--workers 0]

A StreamsBackend with ``--queues`` queues (each read by its sync and async consumers, each of them
reading three priority bands), nothing enqueued: after the start settles, the worker's CPU (% of one
core) and the commands Redis served per second over ``--seconds``, per command and per queue. The
issue-44 goal: under 1% of a core, at most a few commands per second per queue.
"""
import argparse
import json
import subprocess
import time

from common import at_least, cpu_seconds, manage, positive, start_redis


def commands(client):
    return {name[len("cmdstat_"):]: stats["calls"] for name, stats in client.info("commandstats").items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=positive, default=4)
    parser.add_argument("--seconds", type=positive, default=10)
    parser.add_argument("--workers", type=at_least(0), default=0, help="0: one consumer in the runconsumer process")
    args = parser.parse_args()
    server = start_redis()
    client = server.client()
    queues = [f"q{n}" for n in range(args.queues)]
    extra = ["--workers", str(args.workers)] if args.workers else []
    # Only the queues' consumers: the benchmark app's own @consumer handlers would be counted too.
    selectors = [selector for q in queues for selector in (f"tasks:{q}:workers", f"tasks:{q}:async:workers")]
    proc = manage("runconsumer", *selectors, *extra, redis_url=server.url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                  env={"DJANGO_SETTINGS_MODULE": "bench.tasks_settings", "BENCH_TASK_QUEUES": json.dumps(queues)})
    try:
        deadline = time.monotonic() + 60
        while sum(1 for q in queues if client.exists(f"tasks:{q}")) < len(queues):  # the groups are made
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("runconsumer did not start (run it by hand to see why)")
            time.sleep(0.2)
        time.sleep(5)  # start-up settles: first takeover passes, liveness beats
        pids = [proc.pid]
        before, cpu0 = commands(client), sum(cpu_seconds(pid) for pid in pids)
        time.sleep(args.seconds)
        after, cpu1 = commands(client), sum(cpu_seconds(pid) for pid in pids)
        rates = {name: (after[name] - before.get(name, 0)) / args.seconds for name in after}
        rates.pop("info", None)  # this script's own
        total = sum(rates.values())
        cpu = (cpu1 - cpu0) / args.seconds * 100
        print(f"idle runconsumer, {args.queues} queues x (sync + async) x 3 bands"
              f"{f', {args.workers} workers (master CPU only)' if args.workers else ''}:")
        print(f"  CPU {cpu:.2f}% of a core; Redis {total:.1f} commands/s ({total / args.queues:.1f} per queue)")
        for name, rate in sorted(rates.items(), key=lambda item: -item[1]):
            if rate:
                print(f"    {name:24s} {rate:8.1f}/s")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        server.stop()


if __name__ == "__main__":
    main()
