"""Prometheus gauges of consumer groups, set by the reclaim daemon on every pass.

``mostrecent``: with PROMETHEUS_MULTIPROC_DIR set (several daemons or gunicorn workers), the
exported value is the latest one written by any process, not a sum of every daemon's view.
"""
from prometheus_client import Counter, Gauge

LABELS = ["stream", "group"]

group_lag = Gauge("shoal_group_lag", "Entries of the stream not yet delivered to the group.", LABELS, multiprocess_mode="mostrecent")
group_pending = Gauge("shoal_group_pending", "Entries delivered to the group and not yet acknowledged.", LABELS, multiprocess_mode="mostrecent")
group_consumers = Gauge("shoal_group_consumers", "Consumers registered in the group.", LABELS, multiprocess_mode="mostrecent")
dead_letters = Gauge("shoal_dead_letters", "Entries in the stream's dead-letter stream.", ["stream"], multiprocess_mode="mostrecent")
dead_lettered = Counter("shoal_reclaimer_dead_lettered", "Entries the reclaim daemon moved to a dead-letter stream.", LABELS)
trimmed = Counter("shoal_reclaimer_trimmed", "Acknowledged entries the reclaim daemon trimmed.", ["stream"])
