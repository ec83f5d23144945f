"""Issue 48's "Done when", as a user would see it: a fresh Django host project (``django-admin
startproject`` + the README's blocks) with the wheel of this checkout in a venv of its own, served with
``gunicorn -c python:streams_app.web.gunicorn_conf host.wsgi``, 2 workers, ``GUNICORN_MAX_REQUESTS=2000``,
4 load clients. Code that cannot load is deployed; after it, at least ``--requests`` requests; then the
fixed code is deployed and HUP'd, and must be what answers.

    .venv/bin/python bench/web_rollout.py [--scenario aborted-hup|broken-before-hup] [--requests 13200]
        [--python python3.13] [--django 6.1.3] [--max-requests 2000] [--stall 30]

Scenarios: ``aborted-hup`` writes the broken code and sends HUP (the rollout is aborted, the old workers
keep serving through their recycling); ``broken-before-hup`` writes it and sends nothing (a deploy whose
HUP is not sent yet: max_requests recycling meets the broken code first).

Prints the requests after the broken deploy, how many failed (anything but a 200, after the one retry an
HTTP client makes on a kept-alive connection the server closed: tests/serving/load.py), the longest
stretch with no completed request, the master's recycling lines, whether the fixed code answers after
its HUP, and whether the log has the fork warning of Python 3.12+ or a ResourceWarning. The venv is kept
in var/bench/ (built on the first run, the wheel reinstalled each run).
"""
import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, positive, start_redis

from tests.host_project import HostGunicorn, build_wheel, host_env, make_host_project, run
from tests.redis_server import free_port
from tests.serving.gunicorn_process import children_of
from tests.serving.load import Load
from tests.waiting import wait_for

VIEWS = 'from django.http import HttpResponse\n\n\ndef index(request):\n    return HttpResponse("{text}")\n'
BROKEN_VIEWS = "import a_module_nobody_installed  # noqa\n" + VIEWS.format(text="never served")
FORK_WARNING = "use of fork() may lead to deadlocks"
NEXT_ATTEMPT = re.compile(r"Next attempt in (\d+) s")


def venv_for(python, django_version, wheel):
    venv = ROOT / "var" / "bench" / f"web-rollout-{Path(python).name}-django{django_version}"
    env = host_env(venv, "redis://unused", venv.parent)
    if not (venv / "bin" / "gunicorn").exists():
        shutil.rmtree(venv, ignore_errors=True)
        run([python, "-m", "venv", str(venv)])
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[gunicorn]",
             f"Django=={django_version}"], env=env)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
         str(wheel)], env=env)
    return venv


def longest_gap(results, since):
    done = sorted(r.finished for r in results if r.finished >= since)
    return max((b - a for a, b in zip(done, done[1:])), default=0.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("aborted-hup", "broken-before-hup"), default="aborted-hup")
    parser.add_argument("--requests", type=positive, default=13_200,
                        help="requests after the broken deploy (default: 3 × (max_requests + jitter) × 2 workers)")
    parser.add_argument("--python", default="python3.13")
    parser.add_argument("--django", default="6.1.3")
    parser.add_argument("--max-requests", type=positive, default=2000)
    parser.add_argument("--stall", type=positive, default=30,
                        help="give up waiting for the requests after this many seconds with none completed")
    args = parser.parse_args()
    python = shutil.which(args.python) or args.python
    if args.python == "python3.13" and ".pyenv/shims" in python:
        found = sorted(Path.home().glob(".pyenv/versions/3.13.*/bin/python3.13"))
        python = str(found[-1]) if found else python

    tmp = Path(tempfile.mkdtemp(prefix="shoal-web-rollout-"))
    redis = start_redis()
    server = load = None
    try:
        venv = venv_for(python, args.django, build_wheel(tmp))
        version = run([str(venv / "bin" / "python"), "-c",
                       "import sys, django, gunicorn; print(sys.version.split()[0], django.get_version(), "
                       "gunicorn.__version__)"]).split()
        env = host_env(venv, redis.url, tmp)
        site = tmp / "site"
        site.mkdir()
        make_host_project(site, venv, env)
        views = site / "shop" / "views.py"
        views.write_text(VIEWS.format(text="old code"))
        with open(site / "host" / "urls.py", "a") as f:
            f.write('\nfrom shop import views  # noqa: E402\n\nurlpatterns += [path("shop/", views.index)]\n')
        env = {**env, "GUNICORN_MAX_REQUESTS": str(args.max_requests), "PYTHONWARNINGS": "default"}
        server = HostGunicorn(site, venv, env, port=free_port(), workers=2)
        wait_for(lambda: server.answers("/shop/") == 200, timeout=120, what="the host's gunicorn serving /shop/")
        wait_for(lambda: server.output().count(") is ready (app loaded") >= 2, timeout=60, what="both workers ready")
        print(f"Python {version[0]}, Django {version[1]}, gunicorn {version[2]}; 2 workers, "
              f"GUNICORN_MAX_REQUESTS={args.max_requests}, 4 clients; scenario {args.scenario}")

        load = Load(server.port, "/shop/", clients=4, max_requests=10**9).start()
        wait_for(lambda: load.count() >= 200, timeout=60, what="200 requests before the broken deploy")
        views.write_text(BROKEN_VIEWS)
        if args.scenario == "aborted-hup":
            server.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: re.search("ROLLOUT ABORTED|Rollout complete", server.output()), timeout=120,
                     what="the broken HUP's outcome")
            assert "ROLLOUT ABORTED" in server.output(), server.output()[-4000:]
        broken_at = time.monotonic()
        first = load.count()

        def after():
            return sum(r.started > broken_at for r in load.results)

        def done_or_stalled():
            if after() >= args.requests:
                return True
            last = max((r.finished for r in load.results[-50:] if r.status == 200), default=broken_at)
            if time.monotonic() - max(last, broken_at) > args.stall:
                print(f"STOPPED: no request answered for {args.stall} s, {after()} done after the broken deploy")
                return True
            return False

        wait_for(done_or_stalled, timeout=max(600, args.requests / 20), interval=0.5,
                 what=f"{args.requests} requests after the broken deploy")
        seconds = time.monotonic() - broken_at
        broken_results = [r for r in load.results[first:] if r.started > broken_at]
        failed = [r for r in broken_results if r.status != 200]
        output = server.output()
        print(f"after the broken deploy: {len(broken_results)} requests in {seconds:.1f} s "
              f"({len(broken_results) / seconds:.0f}/s), {len(failed)} failed, {load.retries} retried in all, "
              f"longest stretch with no completed request {longest_gap(broken_results, broken_at):.2f} s, "
              f"max latency {max(r.seconds for r in broken_results):.2f} s")
        print(f"bodies: {sorted({r.body for r in broken_results})}")
        print(f"master: {output.count('RECYCLING HELD')} 'RECYCLING HELD', "
              f"{output.count('could not load the application (traceback above)')} failed boots logged, "
              f"{output.count('NO WORKER IS SERVING')} 'NO WORKER IS SERVING', "
              f"{output.count('it serves until the master has its replacement ready')} workers past max_requests, "
              f"{output.count('recycled after max_requests: worker')} recycled, "
              f"retry delays {[int(n) for n in NEXT_ATTEMPT.findall(output)]} s")

        views.write_text(VIEWS.format(text="new code"))
        hup_at, before = len(server.output()), set(children_of(server.proc.pid))
        server.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: re.search("ROLLOUT ABORTED|Rollout complete", server.output()[hup_at:]), timeout=120,
                 what="the fixed HUP's outcome")
        complete_at = time.monotonic()
        # Stopped old workers answer their kept-alive connections for up to 2 s (gthread's linger) before they exit.
        wait_for(lambda: before.isdisjoint(children_of(server.proc.pid)), timeout=60, what="the old workers gone")
        fixed_at = time.monotonic()
        wait_for(lambda: sum(r.started > fixed_at for r in load.results) >= 500, timeout=120,
                 what="500 requests after the old workers exited")
        load.stop()
        draining = [r for r in load.results if complete_at < r.started <= fixed_at]
        later = [r for r in load.results if r.started > fixed_at]
        outcome = re.search(r"ROLLOUT ABORTED|Rollout complete in [\d.]+ s", server.output()[hup_at:]).group()
        print(f"fixed code HUP: {outcome}; while the old workers drained ({fixed_at - complete_at:.1f} s): "
              f"{len(draining)} requests, {sum(r.body == 'new code' for r in draining)} answered by the new code; "
              f"after they exited: {len(later)} requests, {sum(r.status != 200 for r in later)} failed, bodies "
              f"{sorted({r.body for r in later})}")
        print(f"whole run: {load.count()} requests, {len(load.failures())} failed")
        output = server.output()
        print(f"fork warning in the log: {'YES' if FORK_WARNING in output else 'no'}; "
              f"ResourceWarning: {'YES' if 'ResourceWarning' in output else 'no'}; "
              f"master answering: {server.answers('/shop/') == 200}")
    finally:
        if load is not None:
            load.stop()
        if server is not None:
            server.stop()
            (tmp / "gunicorn.log").write_text(server.output())
            print(f"gunicorn's log: {tmp / 'gunicorn.log'}")
        redis.stop()


if __name__ == "__main__":
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    sys.exit(main())
