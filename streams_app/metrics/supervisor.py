"""Prometheus gauges of the runconsumer supervisor, served by ``runconsumer --metrics-port``.

They live in a registry of their own: the master is a process apart from the web tier, and its
metrics must not collide with (or depend on) what the web /metrics endpoint registers.
An external autoscaler (KEDA, an HPA on external metrics) can follow ``shoal_supervisor_group_lag``
across hosts; ``shoal_supervisor_desired_workers`` is what this master's own rule wants.
"""
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from streams_app.metrics import multiprocess


class PoolMetrics:
    def __init__(self, registry=None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.desired = Gauge("shoal_supervisor_desired_workers", "Worker processes the supervisor aims for.",
                             registry=self.registry)
        self.workers = Gauge("shoal_supervisor_workers", "Worker processes by state.", ["state"], registry=self.registry)
        self.lag = Gauge("shoal_supervisor_group_lag", "Entries not yet delivered to the group (XINFO GROUPS lag).",
                         ["stream", "group"], registry=self.registry)
        self.lag_estimated = Gauge("shoal_supervisor_group_lag_estimated",
                                   "1 when Redis reported no lag and it was counted from the stream instead.",
                                   ["stream", "group"], registry=self.registry)

    def set_workers(self, desired, states):
        self.desired.set(desired)
        for state, count in states.items():
            self.workers.labels(state).set(count)

    def set_lags(self, lags):
        for g in lags:
            self.lag.labels(g.stream, g.group).set(g.lag)
            self.lag_estimated.labels(g.stream, g.group).set(1 if g.estimated else 0)

    def collect_workers(self, path):
        """Also report what the worker processes record (handled, failed, durations) under ``path``,
        and the backlog read from Redis at scrape time."""
        from streams_app.metrics.consumer import BacklogCollector

        multiprocess.reset(path)
        self.worker_dir = path
        multiprocess.LockedMultiProcessCollector(self.registry, path)
        self.registry.register(BacklogCollector())

    def worker_exited(self, pid):
        # Fold a dead worker's counters into the archive: totals never go backwards and the
        # directory does not grow with every worker ever started.
        if getattr(self, "worker_dir", None):
            multiprocess.process_dead(pid, self.worker_dir)

    def serve(self, port, addr="127.0.0.1"):
        start_http_server(port, addr=addr, registry=self.registry)
