"""deploy/k8s: the manifests parse, and every Shoal metric their queries read is one Shoal exports."""
import re
from pathlib import Path

import yaml

from streams_app.metrics import consumer as consumer_metrics
from streams_app.metrics import supervisor  # noqa: F401  (registers the pool gauges)

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
METRIC = re.compile(r"\bshoal_[a-z_]+")


def documents():
    return [(path.name, doc) for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def exported_names():
    from prometheus_client import REGISTRY

    names = {family.name for family in consumer_metrics.BacklogCollector().describe()}
    names |= {family.name for family in REGISTRY.collect()}
    return names


def queried(doc):
    """PromQL strings in a manifest: KEDA prometheus triggers and prometheus-adapter rules."""
    if doc["kind"] == "ScaledObject":
        return [t["metadata"]["query"] for t in doc["spec"]["triggers"] if t["type"] == "prometheus"]
    if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {}):
        rules = yaml.safe_load(doc["data"]["config.yaml"])
        return [r[key] for r in rules.get("externalRules", []) for key in ("seriesQuery", "metricsQuery")]
    return []


def test_the_manifests_parse_and_name_what_they_scale():
    docs = documents()
    kinds = {doc["kind"] for _, doc in docs}
    assert {"Deployment", "ScaledObject", "HorizontalPodAutoscaler", "ConfigMap", "Service"} <= kinds
    deployments = {doc["metadata"]["name"] for _, doc in docs if doc["kind"] == "Deployment"}
    for _, doc in docs:
        if doc["kind"] in ("ScaledObject", "HorizontalPodAutoscaler"):
            assert doc["spec"]["scaleTargetRef"]["name"] in deployments


def test_every_metric_the_autoscalers_read_is_exported_by_shoal():
    exported = exported_names()
    queries = [q for _, doc in documents() for q in queried(doc)]
    assert queries, "no query found in deploy/k8s"
    used = {name for query in queries for name in METRIC.findall(query)}
    assert used and used <= exported, f"not exported by Shoal: {sorted(used - exported)}"
    assert "shoal_group_backlog" in used  # the backlog, not Redis's lag (null after deletions)
