"""No-op Tasks per second with ``runconsumer --workers`` 1, 2 and 4, on one redis-server and on a local
3-master Redis Cluster; and the bytes a finished result occupies in Redis.

    .venv/bin/python bench/tasks_scale.py [--tasks 8000] [--workers 1 2 4] [--no-cluster]

Per configuration (a child process of its own, Django set up against that Redis): ``enqueue_many`` of
N no-op tasks (bench/benchapp/tasks.py), then ``runconsumer tasks:bnoop:workers --workers W`` (default
THREADS 4 per worker) consumes them, timed from the first entry read to the last one acked. The CPU is
that of the whole supervisor tree (getrusage of the waited children), start-up and the Django boot of
every worker included: with several workers that start-up is a real share of a short run.

Then ``MEMORY USAGE`` of finished results (SUCCESSFUL, return value None, one int argument) and the
per-task share of the queue's results index; with RESULT_TTL (default 7 days) that is what a queue holds
in Redis: bytes per result x tasks per second x RESULT_TTL seconds.
"""
import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

from common import ROOT, group_progress, manage, positive, setup_django, start_redis

SETTINGS = "bench.tasks_settings"


def child(args):
    setup_django(args.url, SETTINGS)
    import redis as redis_py

    from bench.benchapp import tasks as bench_tasks
    from streams_app.redis.connection import get_connection
    from streams_app.tasks import enqueue_many, messages, results

    conn = get_connection()
    # group_progress matches names as text: a decoded client of the same server (a cluster's through its seeds).
    decoded = (redis_py.RedisCluster if isinstance(conn, redis_py.RedisCluster) else redis_py.Redis).from_url(
        args.url, decode_responses=True)
    stream = messages.stream_name("bnoop")
    ids = []
    for start in range(0, args.tasks, 5000):
        ids += [r.id for r in enqueue_many(bench_tasks.noop, [((n,), {}) for n in range(start, min(start + 5000, args.tasks))])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers = args.workers[0]
    proc = manage("runconsumer", messages.selector("bnoop"), "--workers", str(workers), "-v", "0",
                  redis_url=args.url, env={"DJANGO_SETTINGS_MODULE": SETTINGS})
    deadline = time.monotonic() + 600
    start = None
    while time.monotonic() < deadline:
        read, pending = group_progress(decoded, stream, messages.GROUP) if decoded.exists(stream) else (0, 0)
        now = time.monotonic()
        if start is None and read > 0:
            start = now
        if read >= args.tasks and pending == 0:
            break
        if proc.poll() is not None:
            raise SystemExit(f"runconsumer exited ({proc.returncode}) before consuming the tasks")
        time.sleep(0.005)
    else:
        raise SystemExit("the tasks were not all consumed in 600 s")
    seconds = now - start
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    sample = ids[:: max(1, len(ids) // 50)]
    records = results.many(conn, sample)
    assert all(r is not None and r["status"] == "SUCCESSFUL" for r in records), "a result is not SUCCESSFUL"
    result_bytes = sum(conn.memory_usage(results.key(i), samples=0) for i in sample) / len(sample)
    index_bytes = conn.memory_usage(results.index_key("bnoop"), samples=0) / len(ids)
    print(json.dumps({"rate": args.tasks / seconds, "cpu_us": cpu / args.tasks * 1e6,
                      "result_bytes": result_bytes, "index_bytes": index_bytes}))


def run(url, workers, tasks):
    out = subprocess.run([sys.executable, __file__, "--child", "--url", url, "--workers", str(workers), "--tasks",
                          str(tasks)], cwd=ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS},
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"the run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=positive, default=8000)
    parser.add_argument("--workers", type=positive, nargs="+", default=[1, 2, 4])
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    from tests.redis_cluster import RedisClusterServer

    setups = [("single", start_redis())]
    if not args.no_cluster:
        setups.append(("cluster", RedisClusterServer(tempfile.mkdtemp(prefix="shoal-bench-cluster-")).start()))
    print(f"{args.tasks} no-op tasks per run; load {os.getloadavg()[0]:.1f}")
    try:
        for kind, server in setups:
            for workers in args.workers:
                if kind == "single":
                    server.client().flushall()
                else:
                    server.flushall(server.client())
                f = run(server.url, workers, args.tasks)
                print(f"{kind:8} --workers {workers}: {f['rate']:>8,.0f} tasks/s, CPU {f['cpu_us']:5.0f} µs/task "
                      f"(all processes, start-up included); a finished result {f['result_bytes']:.0f} B + "
                      f"{f['index_bytes']:.0f} B of index  (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for _, server in setups:
            server.stop()


if __name__ == "__main__":
    main()
