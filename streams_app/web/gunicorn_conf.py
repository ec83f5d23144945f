"""gunicorn settings for a Shoal web tier, from any Django project (``project/`` of this repository uses it too).

    gunicorn -c python:streams_app.web.gunicorn_conf mysite.wsgi
    # or, in your own gunicorn.conf.py:  from streams_app.web.gunicorn_conf import *  (then override what you like)

gunicorn's master is the web tier's pre-fork master: it forks the workers, restarts dead ones,
recycles them after ``max_requests``, and on ``kill -HUP <master pid>`` starts new
workers with freshly imported code before stopping the old ones gracefully. This file adds what
gunicorn does not do: the worker count from the CPUs the container may use, Prometheus metrics
across workers that survive recycling, broadcast listeners, and discovery registration.

The master imports no application code (no Django, no settings, no app modules): what the master
has imported, every worker it forks inherits unreloaded, so HUP could not load new code. The
hooks here use only ``shoal_common`` (cpus, web_rollout, web_recycling, web_supervision) and
``streams_app.metrics.multiprocess`` (prometheus_client, no Django). Nor does the master run threads of
ours: it forks its workers from its one thread (Python 3.12+ warns when a process forks with others).

Environment: WEB_CONCURRENCY (workers), GUNICORN_THREADS, GUNICORN_MAX_REQUESTS, PORT (gunicorn's
own: binds 0.0.0.0:$PORT, else 127.0.0.1:8000), PROMETHEUS_MULTIPROC_DIR (default $SHOAL_VAR_DIR/prometheus),
WEB_ADVERTISE_ADDRESS (address registered in discovery when bound to 0.0.0.0; default: the interface of
the default route, never a loopback address), SHOAL_VAR_DIR (default: var/ in the working directory).
Discovery registration runs only when discovery_app is in INSTALLED_APPS (a process of its own, ``python -m
discovery_app.web_registration``, which registers nothing and idles when it is not).
"""
import json
import os
import random
import sys
import uuid
from importlib.util import find_spec
from pathlib import Path

VAR = Path(os.environ.get("SHOAL_VAR_DIR", Path.cwd() / "var"))
VAR.mkdir(parents=True, exist_ok=True)
# Before anything below imports prometheus_client: it picks single- or multi-process mode once, at
# import time, and the workers inherit the master's modules. Set after the import, every worker
# stayed single-process and /metrics showed only the worker that took the scrape.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR / "prometheus"))

from shoal_common import web_recycling, web_rollout, web_supervision  # noqa: E402
from shoal_common.cpus import web_concurrency  # noqa: E402
from streams_app.metrics import multiprocess  # noqa: E402
# Where the registration supervisor writes its state, for the workers' /readyz.
os.environ.setdefault(web_supervision.STATUS_ENV, str(VAR / "web_registration.json"))
# Where the master says whether recycling is held (a worker failed to load the app), for the workers,
# /readyz and /metrics.
os.environ.setdefault(web_recycling.STATUS_ENV, str(VAR / "web_rollout.json"))

workers = web_concurrency()
# gthread: a few threads per process serve requests that wait on Redis or the database, and keep-alive
# connections are held by the poller, not by a thread. No monkey-patching (gevent would change how
# redis-py blocks and how the consumer and registrar threads behave), and one stuck request does not
# stall a whole worker the way the sync worker's single thread would.
# gthread, closing its listening sockets as soon as it drains: new connections are refused (clients retry
# elsewhere) instead of queued for a worker that will not accept them and reset when it exits.
worker_class = "shoal_common.web_worker.ThreadWorker"
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
keepalive = 5
timeout = 30
graceful_timeout = 30
preload_app = False  # each worker imports the app itself, so HUP loads new code
# Recycle workers now and then (leaks in third-party code); the jitter keeps them from all
# restarting at the same moment.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "10000"))
max_requests_jitter = max(1, max_requests // 10)
pidfile = str(VAR / "gunicorn.pid")
# gunicorn's control socket (gunicornc) is off: it is served by a thread of the master, which gunicorn
# stops before each fork and starts again in the parent's after-fork hook, and Python 3.13 counts the
# threads after that hook: every fork after the first warned "multi-threaded, use of fork() may lead to
# deadlocks". To have it anyway (the warning with it), set control_socket_disable = False in your own
# gunicorn.conf.py; it lives beside the pidfile, not in ~/.gunicorn, which every gunicorn of the user
# would fight over (a unix socket path has a length limit).
control_socket = str(VAR / "gunicorn.ctl")
control_socket_disable = True
proc_name = "shoal-web"


def on_starting(server):
    # HUP replaces a worker only once its replacement has loaded the app, and code that cannot load
    # leaves the serving workers alone (shoal_common/web_rollout.py).
    web_rollout.install(server)
    # Files left by a previous master belong to processes that are gone: start the counters afresh
    # (Prometheus sees a counter reset, as for any restart).
    multiprocess.reset(os.environ[multiprocess.ENV])


def when_ready(server):
    # The supervisor is kept on the arbiter: HUP re-reads this file into a new module, and one left
    # in the old module would be collected, closing its pipe and deregistering.
    server.shoal_registration = None
    if find_spec("discovery_app") is None:  # finds the package without importing it
        return
    listener = server.LISTENERS[0]
    address = listener.sock.getsockname()
    if not isinstance(address, tuple):
        server.log.info("Discovery registration skipped: listening on a unix socket (%s).", listener)
        return
    host, why = web_supervision.advertised_address(address[0])
    if host is None:
        server.log.error("Discovery registration skipped: %s.", why)
        return
    port = address[1]
    scheme = "https" if server.cfg.is_ssl else "http"
    metadata = {"master_pid": os.getpid(), "workers": server.num_workers, "scheme": scheme}
    # One id for the master's life: a restarted registration process replaces its own record.
    instance_id = f"web-{host}-{port}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    # The WSGI module too: importing it sets DJANGO_SETTINGS_MODULE where the environment does not.
    argv = [sys.executable, "-m", "discovery_app.web_registration", host, str(port), json.dumps(metadata), instance_id,
            server.app.app_uri or ""]
    supervisor = web_supervision.RegistrationSupervisor(argv, os.getcwd(), server.log,
                                                        os.environ[web_supervision.STATUS_ENV])
    server.shoal_registration = supervisor.start()
    # Looked after from the arbiter's loop, which also has it deregister first when the master stops.
    server.companions.append(supervisor)
    server.log.info("Discovery registration started for %s://%s:%s, advertised as %s (pid %s).",
                    scheme, host, port, why, supervisor.process.pid)


def on_exit(server):
    supervisor = getattr(server, "shoal_registration", None)
    if supervisor is not None:
        try:
            supervisor.stop()  # EOF: the registration process deregisters (if it has not) and exits
        except Exception:
            # The master is exiting with its own code (3 after a boot error): an exception here made it 1.
            server.log.exception("Discovery registration: stopping the registration process failed")


def post_fork(server, worker):
    # The master opens no Redis connection (registration is a separate process) and runs no thread of
    # ours. All a worker inherits of ours is the registration process's pipe, which it must not hold
    # open, or the registration process would not see the master die.
    supervisor = getattr(server, "shoal_registration", None)
    if supervisor is not None:
        supervisor.close_in_child()  # this process's copy only; the master's stays open
    random.seed()  # random state differs per worker (jitter, names)
    web_rollout.child_started(server, worker)


def post_worker_init(worker):
    # First: a worker whose application cannot answer (a view that cannot be imported, a setting the
    # system checks refuse, a request that fails) must never say it is ready. Raising here fails its
    # boot, so a HUP leaves the old workers serving and a first start halts. Django's stock wsgi.py
    # loads no URLconf: without this, such a deploy was rolled out and every page was a 500.
    from streams_app.web.app_check import verify

    verify(worker.wsgi)
    try:
        from streams_app.broadcast import start_listener

        start_listener()
    except Exception:
        worker.log.exception("Broadcast listener did not start; this worker will not receive broadcasts.")
    try:
        from streams_app.metrics import worker as worker_metrics

        worker_metrics.start(web_rollout.worker_slot())
    except Exception:
        worker.log.exception("Per-worker metrics did not start; /metrics lacks this worker's memory and uptime.")
    # Last: from now on the master may stop an old worker in favour of this one.
    web_rollout.announce_ready()


def worker_exit(server, worker):
    broadcast = sys.modules.get("streams_app.broadcast")  # absent when the app failed to load
    if broadcast is not None:
        broadcast.stop_listener(timeout=1.0)
    connections = sys.modules.get("shoal_common.connections")  # imported once the app loaded
    if connections is not None:
        connections.close_all()


def child_exit(server, worker):
    # The dead worker's counters go into the archive files, its gauges away: /metrics keeps its
    # totals and the directory stays as large as the live workers need.
    multiprocess.process_dead(worker.pid, os.environ[multiprocess.ENV])
