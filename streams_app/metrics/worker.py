"""Per-worker process figures of the gunicorn web tier, in /metrics: memory, uptime, CPU, pid.

Labelled by the worker's slot (shoal_common/web_rollout.py), not its pid: slots are reused as workers
are recycled, so the series stay within 0..2×workers (a HUP runs old and new side by side) where
pids would make a new series for every worker ever started. ``shoal_web_worker_pid`` says which
process holds a slot now. A dead worker's gauges leave with it (its files are removed when the
master reaps it).

Started from gunicorn.conf.py's ``post_worker_init``; a thread refreshes the figures every few seconds.
"""
import os
import threading
import time

from prometheus_client import Gauge

REFRESH = 5.0
LABELS = ("worker",)

# "max": each slot has one live writer, so the merge across processes is that writer's value.
MEMORY = Gauge("shoal_web_worker_resident_memory_bytes", "Resident memory of the gunicorn worker in this slot.",
               LABELS, multiprocess_mode="max")
UPTIME = Gauge("shoal_web_worker_uptime_seconds", "Seconds the gunicorn worker in this slot has been running.",
               LABELS, multiprocess_mode="max")
CPU = Gauge("shoal_web_worker_cpu_seconds", "CPU time (user + system) of the gunicorn worker in this slot.",
            LABELS, multiprocess_mode="max")
PID = Gauge("shoal_web_worker_pid", "Process id of the gunicorn worker in this slot.", LABELS, multiprocess_mode="max")

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes():
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def update(labels, started):
    memory = resident_bytes()
    if memory is not None:
        MEMORY.labels(*labels).set(memory)
    UPTIME.labels(*labels).set(time.time() - started)
    times = os.times()
    CPU.labels(*labels).set(times.user + times.system)


def start(slot, interval=REFRESH):
    """Publish this worker's figures under ``slot`` now, then every ``interval`` seconds."""
    labels = (str(slot),)
    started = time.time()
    PID.labels(*labels).set(os.getpid())
    update(labels, started)

    def refresh():
        while True:
            time.sleep(interval)
            update(labels, started)

    threading.Thread(target=refresh, name="shoal-worker-metrics", daemon=True).start()
