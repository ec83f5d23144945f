"""Requests/s of a trivial Shoal view under gunicorn against a bare WSGI app under the same settings,
and the failed requests while the master is sent HUP twice under load.

    .venv/bin/python bench/http_bench.py [--seconds 10] [--clients 8]

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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="Length of each measurement.")
    parser.add_argument("--clients", type=int, default=8, help="Concurrent client connections.")
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
        shoal_rate, shoal_failed, tool = measure(shoal.port, "/hello", args.seconds, args.clients)
        bare_rate, bare_failed, _ = measure(bare.port, "/", args.seconds, args.clients)
        print(f"load from: {tool}")
        print(f"(a) bare WSGI hello:        {bare_rate:>8,.0f} req/s  ({bare_failed} failed)")
        print(f"(b) Shoal view (Django):    {shoal_rate:>8,.0f} req/s  ({shoal_failed} failed)")
        print(f"ratio b/a: {shoal_rate / bare_rate:.2f}")

        load = Load(shoal.port, "/hello", clients=args.clients, max_requests=10**9).start()
        time.sleep(1)
        for _ in range(2):
            replace_workers(shoal)
            time.sleep(1)
        load.stop()
        print(f"two HUPs under load: {load.count()} requests, {len(load.failures())} failed, "
              f"{load.retries} retried after the server closed a kept-alive connection")
    finally:
        for server in servers:
            server.stop()
        redis.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
