"""Shoal's web endpoints for a host project: ``path("", include("streams_app.web.urls"))``.

``/healthz`` (the process answers), ``/readyz`` (Redis and the database answer within
``settings.READYZ_TIMEOUT``, default 1 s) and ``/metrics`` (Prometheus: every gunicorn worker's
metrics plus the consumer groups' backlog). Kubernetes probes that use the pod IP as Host need the
host in ALLOWED_HOSTS, or ``streams_app.web.health.HealthCheckMiddleware`` first in MIDDLEWARE.
"""
from django.urls import path

from streams_app.web.health import healthz, readyz
from streams_app.web.metrics_view import metrics

urlpatterns = [
    path("healthz", healthz, name="shoal-healthz"),
    path("readyz", readyz, name="shoal-readyz"),
    path("metrics", metrics, name="metrics"),
]
