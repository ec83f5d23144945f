"""Requests/s of a trivial Shoal view under gunicorn against a bare WSGI app under the same settings,
and what a HUP under steady load costs: failed requests, p99 and max latency, and the longest gap with
no completed request, during each reload (HUP until every old worker is gone) against the steady
stretch before it.

    .venv/bin/python bench/http_bench.py [--seconds 10] [--clients 8] [--reload-only] [--hups 2]

(Not bench/http.py: scripts run from bench/ have it first on sys.path, where a module named http
would shadow the standard library's http package for every script there.)

Both servers run gunicorn.conf.py (workers from the CPU quota, gthread, 4 threads). The Shoal view
goes through the whole middleware stack (django-prometheus included). Load comes from wrk when it
is installed, else from a Python load loop in a separate process (half the clients keep-alive, half
a new connection per request): on a small machine that client is a bottleneck of its own, so
compare the two figures with each other rather than with other hardware.
"""
import argparse
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from common import ROOT, start_redis

from tests.serving.gunicorn_process import Gunicorn
from tests.serving.load import Load
from tests.waiting import wait_for


def python_load(port, path, seconds, clients, queue):
    load = Load(port, path, clients=clients, max_requests=10**9).start()
    time.sleep(seconds)
    load.stop()
    queue.put((load.count(), len(load.failures()), load.retries))


def measure(port, path, seconds, clients):
    """(requests/s, failed requests, tool)."""
    wrk = shutil.which("wrk")
    if wrk:
        out = subprocess.run([wrk, "-t2", f"-c{clients}", f"-d{seconds}s", f"http://127.0.0.1:{port}{path}"],
                             capture_output=True, text=True, check=True).stdout
        rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        return rate, int(errors.group(1)) if errors else 0, "wrk"
    queue = multiprocessing.Queue()
    proc = multiprocessing.Process(target=python_load, args=(port, path, seconds, clients, queue))
    proc.start()
    count, failed, _ = queue.get()
    proc.join()
    return count / seconds, failed, "python load loop"


def replace_workers(server):
    old = set(server.worker_pids())
    server.signal(signal.SIGHUP)
    wait_for(lambda: old.isdisjoint(server.worker_pids()) and len(server.worker_pids()) == server.workers,
             timeout=120, what="workers replaced after HUP")


def window(results, start, end):
    """Figures of the requests around [start, end]: (requests, failed, p99, max latency, longest gap)
    where the longest gap is the longest time in the window with no request completed."""
    overlapping = [r for r in results if r.finished >= start and r.started <= end]
    latencies = sorted(r.seconds for r in overlapping) or [0.0]
    finished = sorted(r.finished for r in results if start <= r.finished <= end)
    edges = [start, *finished, end]
    gap = max(b - a for a, b in zip(edges, edges[1:]))
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    failed = sum(r.status != 200 for r in overlapping)
    return len(overlapping), failed, p99, latencies[-1], gap


def reload_under_load(server, clients, hups, settle=3.0):
    """HUP the master under steady load; compare each reload (HUP until every old worker is gone)
    with the steady stretch before it."""
    load = Load(server.port, "/hello", clients=clients, max_requests=10**9).start()
    rows = []
    try:
        time.sleep(settle)
        for _ in range(hups):
            quiet_start = time.monotonic()
            time.sleep(settle)
            hup_at = time.monotonic()
            replace_workers(server)
            done_at = time.monotonic()
            rows.append((window(load.results, quiet_start, hup_at), window(load.results, hup_at, done_at),
                         done_at - hup_at))
    finally:
        load.stop()
    print(f"{hups} HUPs under load ({clients} clients): {load.count()} requests, {len(load.failures())} failed, "
          f"{load.retries} retried after the server closed a kept-alive connection")
    print("                      requests  failed   p99 ms   max ms  longest gap ms")
    for number, (outside, during, took) in enumerate(rows, start=1):
        for label, (count, failed, p99, worst, gap) in ((f"HUP {number} outside", outside),
                                                        (f"HUP {number} during ({took:.1f} s)", during)):
            print(f"{label:<22}{count:>8}{failed:>8}{p99 * 1000:>9.0f}{worst * 1000:>9.0f}{gap * 1000:>16.0f}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="Length of each measurement.")
    parser.add_argument("--clients", type=int, default=8, help="Concurrent client connections.")
    parser.add_argument("--reload-only", action="store_true", help="Only the HUPs under load, not the req/s runs.")
    parser.add_argument("--hups", type=int, default=2, help="HUPs under load (default 2).")
    args = parser.parse_args()
    redis = start_redis()
    scratch = Path(tempfile.mkdtemp(prefix="shoal-bench-http-"))
    env = {"PYTHONPATH": str(ROOT / "bench" / "http_apps"), "DJANGO_SETTINGS_MODULE": "http_settings"}
    servers = []
    try:
        shoal = Gunicorn(scratch / "shoal", redis.url, workers=None, env=env, app="project.wsgi")
        bare = Gunicorn(scratch / "bare", redis.url, workers=None, env=env, app="hello_wsgi:application")
        for server in (shoal, bare):
            servers.append(server.start())
        print(f"gunicorn.conf.py settings: {shoal.workers} workers x 4 threads (gthread) each; {args.clients} clients, {args.seconds} s per run")
        if not args.reload_only:
            shoal_rate, shoal_failed, tool = measure(shoal.port, "/hello", args.seconds, args.clients)
            bare_rate, bare_failed, _ = measure(bare.port, "/", args.seconds, args.clients)
            print(f"load from: {tool}")
            print(f"(a) bare WSGI hello:        {bare_rate:>8,.0f} req/s  ({bare_failed} failed)")
            print(f"(b) Shoal view (Django):    {shoal_rate:>8,.0f} req/s  ({shoal_failed} failed)")
            print(f"ratio b/a: {shoal_rate / bare_rate:.2f}")

        reload_under_load(shoal, args.clients, args.hups)
    finally:
        for server in servers:
            server.stop()
        redis.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
