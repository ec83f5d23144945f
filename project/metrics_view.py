"""``/metrics``: every gunicorn worker's metrics at once, plus the consumer groups' backlog from Redis."""
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from streams_app.metrics import multiprocess
from streams_app.metrics.consumer import BacklogCollector

_backlog = CollectorRegistry(auto_describe=False)
_backlog.register(BacklogCollector())


@never_cache
def metrics(request):
    path = multiprocess.directory()
    # Under gunicorn each worker writes its own files; any worker that takes the scrape reads all.
    registry = multiprocess.multiprocess_registry(path) if path else REGISTRY
    return HttpResponse(generate_latest(registry) + generate_latest(_backlog), content_type=CONTENT_TYPE_LATEST)
