"""Metrics of ordered mode (streams_app/consuming/leases.py)."""
from prometheus_client import Gauge

partitions_held = Gauge(
    "shoal_partitions_held",
    "Ordered mode: partitions of the logical stream whose lease this consumer holds for the group.",
    ("logical_stream", "group", "consumer"), multiprocess_mode="livesum",
)


def set_held(logical_stream, group, consumer, count):
    partitions_held.labels(logical_stream, group, consumer).set(count)


def forget(logical_stream, group, consumer):
    """A consumer that left holds nothing; drop its series rather than keep a 0 for a gone name."""
    try:
        partitions_held.remove(logical_stream, group, consumer)
    except KeyError:
        pass
