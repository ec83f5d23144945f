"""``/metrics``: every gunicorn worker's metrics at once, plus the consumer groups' backlog from Redis."""
import os

from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from shoal_common.redisconn import dedicated_connection
from streams_app.redis.connection import get_connection
from streams_app.metrics import multiprocess
from streams_app.metrics.consumer import BacklogCollector
from streams_app.metrics.recycling import RecyclingCollector

REDIS_TIMEOUT = 2.0
"""Seconds the backlog queries get: a hung Redis makes a scrape report ``shoal_backlog_scrape_ok 0``
quickly instead of holding a worker thread for the shared connection's 30 s."""

_clients = {}


def scrape_connection():
    """A client of this process with short timeouts, made once (its pool is reused by later scrapes)."""
    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = dedicated_connection(get_connection(), socket_timeout=REDIS_TIMEOUT,
                                             socket_connect_timeout=REDIS_TIMEOUT)
    return _clients[pid]


_backlog = CollectorRegistry(auto_describe=False)
_backlog.register(BacklogCollector(connection=scrape_connection))
_web = CollectorRegistry(auto_describe=False)
_web.register(RecyclingCollector())


@never_cache
def metrics(request):
    path = multiprocess.directory()
    # Under gunicorn each worker writes its own files; any worker that takes the scrape reads all.
    registry = multiprocess.multiprocess_registry(path) if path else REGISTRY
    return HttpResponse(generate_latest(registry) + generate_latest(_backlog) + generate_latest(_web),
                        content_type=CONTENT_TYPE_LATEST)
