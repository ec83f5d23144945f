"""``/healthz`` (the process answers: no I/O) and ``/readyz`` (Redis and the database answer in time, and
the application's URLconf loads).

Two ways in: ``path("", include("streams_app.web.urls"))`` (simplest), or the middleware
``streams_app.web.health.HealthCheckMiddleware`` at the top of MIDDLEWARE (what project/ does), which answers
before ALLOWED_HOSTS, sessions and auth: probes come from the orchestrator
with a pod IP as Host, which ALLOWED_HOSTS would refuse, and they need no session, CSRF or auth.
"""
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor, wait

from django.conf import settings
from django.http import HttpResponse

from streams_app.web.app_check import MARKER as APP_CHECK_MARKER

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"


def check_redis(timeout):
    from shoal_common.redisconn import is_cluster
    from streams_app.redis.connection import get_connection

    shared = get_connection()
    if is_cluster(shared):
        return check_redis_cluster(shared, timeout)
    import redis

    shared = shared.connection_pool
    # A private connection with the probe's timeout: the shared pool's 30 s socket timeout exists
    # for blocking reads and would make a hung Redis look alive for half a minute.
    kwargs = dict(shared.connection_kwargs, socket_timeout=timeout, socket_connect_timeout=timeout)
    pool = type(shared)(connection_class=shared.connection_class, **kwargs)
    try:
        redis.Redis(connection_pool=pool).ping()
    finally:
        pool.disconnect()


def check_redis_cluster(shared, timeout):
    """Ready when a node answers and says ``cluster_state:ok`` (every slot served, no failover under way).

    Asked on private connections with the probe's timeout, node after node: one dead master is
    what a failover is for, and the survivors say whether the cluster is whole again.
    """
    import redis

    kwargs = {k: v for k, v in shared.get_connection_kwargs().items() if k in ("username", "password")}
    errors = []
    for node in shared.get_nodes():
        client = redis.Redis(host=node.host, port=node.port, socket_timeout=timeout,
                             socket_connect_timeout=timeout, decode_responses=True, **kwargs)
        try:
            state = client.cluster("info").get("cluster_state")
        except redis.RedisError as exc:
            errors.append(f"{node.name}: {exc}")
            continue
        finally:
            client.close()
        if state != "ok":
            raise ClusterNotOk(f"cluster_state is {state} on {node.name}")
        return
    raise redis.ConnectionError("no cluster node answered: " + "; ".join(errors))


def check_database(timeout):
    from django.db import connection

    # Runs in a thread of its own, so this is a connection of its own, closed afterwards.
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()


def check_application(timeout):
    # The application answers only if its URLconf loads: with HealthCheckMiddleware first, a view that
    # cannot be imported left /readyz at 200 while every other page was a 500.
    from streams_app.web.app_check import load_urlconf

    load_urlconf()


CHECKS = {"redis": check_redis, "database": check_database, "application": check_application}

# Under streams_app: a host project has no `project` package, and its LOGGING names streams_app.*.
# Its name from before the module moved to streams_app.web (issue 49): hosts' LOGGING names it.
logger = logging.getLogger("streams_app.health")
_last_error = {}  # check name -> the last error logged for it, in this process


def short_reason(exc):
    """What a probe's caller may see: a few words, never addresses, credentials or driver text (the
    details go to this process's log)."""
    import redis

    if isinstance(exc, (redis.TimeoutError, TimeoutError)):
        return "timed out"
    if isinstance(exc, redis.BusyLoadingError):
        return "loading its data"
    if isinstance(exc, (redis.ConnectionError, ConnectionError)):
        return "cannot connect"
    if isinstance(exc, ClusterNotOk):
        return "cluster not ok"
    from streams_app.web.app_check import ApplicationCannotLoad

    if isinstance(exc, ApplicationCannotLoad):
        return "cannot load"
    return "failed"


class ClusterNotOk(RuntimeError):
    pass


def _log_change(name, detail):
    # Once per change, not per probe: an orchestrator probes every few seconds.
    if _last_error.get(name) == detail:
        return
    _last_error[name] = detail
    if detail is None:
        logger.info("Readiness: %s answers again", name)
    else:
        logger.warning("Readiness: %s is failing: %s", name, detail)


def run_checks(timeout, checks=None):
    """``{name: "ok" or what went wrong}``; every check runs at once and gets ``timeout`` seconds."""
    checks = CHECKS if checks is None else checks
    pool = ThreadPoolExecutor(len(checks), thread_name_prefix="shoal-readyz")
    try:
        futures = {name: pool.submit(check, timeout) for name, check in checks.items()}
        wait(futures.values(), timeout=timeout)
        results = {}
        for name, future in futures.items():
            if not future.done():
                results[name] = detail = f"no answer within {timeout:g}s"
            elif future.exception() is not None:
                exc = future.exception()
                results[name] = short_reason(exc)
                detail = f"{type(exc).__name__}: {exc}"
            else:
                results[name], detail = "ok", None
            _log_change(name, detail)
        return results
    finally:
        pool.shutdown(wait=False)  # a hung check must not hold the probe past its timeout


def discovery_registration():
    """The gunicorn master's registration supervisor's last word (shoal_common/web_supervision.py):
    state, pid, restarts. None outside gunicorn. Shown, not failed on: the instance serves fine
    while its registration restarts, and the supervisor restarts it within seconds."""
    path = os.environ.get("SHOAL_WEB_REGISTRATION_STATUS")
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        return {"state": "unknown", "error": type(exc).__name__}


def web_rollout():
    """Whether the gunicorn master holds worker recycling (shoal_common/web_recycling.py), or None outside
    Shoal's gunicorn config. Shown, not failed on: while it is held the old code serves, which is the
    point; failing /readyz would take the instance out of rotation for a deploy that never happened."""
    from shoal_common.web_recycling import read_state

    return read_state()


def readiness():
    started = time.monotonic()
    results = run_checks(getattr(settings, "READYZ_TIMEOUT", 1.0))
    failing = [name for name, result in results.items() if result != "ok"]
    body = {
        "status": "unavailable" if failing else "ok",
        "failing": failing,
        "checks": results,
        "seconds": round(time.monotonic() - started, 3),
    }
    registration = discovery_registration()
    if registration is not None:
        body["discovery_registration"] = registration
    rollout = web_rollout()
    if rollout is not None:
        body["web_rollout"] = rollout
    response = HttpResponse(json.dumps(body), status=503 if failing else 200, content_type="application/json")
    # A 503 here is an answer about Redis or the database, not an error of this request: without this,
    # django.request logs an ERROR on every probe (360 an hour per pod at Kubernetes' default period).
    response._has_been_logged = True
    return response


def healthz(request):
    return HttpResponse("ok\n", content_type="text/plain")


def readyz(request):
    return readiness()


class HealthCheckMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.META.get(APP_CHECK_MARKER):
            # The gunicorn worker's own check before it says it is ready (streams_app/web/app_check.py): it must go
            # through the middleware below and the URLconf, or new code whose later middleware fails every
            # request was rolled out.
            return self.get_response(request)
        if request.path == HEALTH_PATH:
            return HttpResponse("ok\n", content_type="text/plain")
        if request.path == READY_PATH:
            return readiness()
        return self.get_response(request)
