"""The Grafana dashboard plots only metrics that Shoal exports, and plots every shoal_* metric."""
import json
import re
from pathlib import Path

from django_prometheus.middleware import Metrics
from prometheus_client import REGISTRY

from streams_app.metrics import worker as worker_metrics  # noqa: F401  (registers the per-worker gauges)
from streams_app.metrics import consumer as metrics
from streams_app.metrics import ordered as ordered_metrics  # noqa: F401  (registers shoal_partitions_held)
from streams_app.metrics import tasks as task_metrics  # noqa: F401  (registers the shoal_tasks_* counters)
from streams_app.metrics.recycling import RecyclingCollector
from streams_app.metrics.supervisor import PoolMetrics

DASHBOARD = Path(__file__).resolve().parent.parent.parent / "deploy" / "grafana" / "shoal.json"
METRIC = re.compile(r"\b((?:django_http|shoal)_[a-z_]+)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported():
    Metrics.get_instance()  # registers the django_http_* metrics, as the first request does
    pool = PoolMetrics()  # the supervisor's own registry, served by runconsumer --metrics-port
    # The web tier's recycling gauges exist while Shoal's gunicorn master writes its state: as if it did.
    recycling = RecyclingCollector(read=lambda: {"recycling": "held", "since": 0}).collect()
    families = [*REGISTRY.collect(), *metrics.BacklogCollector().describe(), *pool.registry.collect(), *recycling]
    return {f.name + suffix: f.name for f in families for suffix in SUFFIXES.get(f.type, ("",))}


def test_every_panel_query_names_an_exported_metric_and_every_shoal_metric_is_plotted():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    used = {name for panel in panels for target in panel.get("targets", ()) for name in METRIC.findall(target["expr"])}
    names = exported()
    assert used and used <= set(names), sorted(used - set(names))
    shoal_families = {family for family in names.values() if family.startswith("shoal_")}
    assert {names[name] for name in used} >= shoal_families
