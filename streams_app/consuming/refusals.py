"""Writes Redis refuses at ``maxmemory``: counted, logged once per episode, never fatal.

At maxmemory with ``noeviction`` Redis refuses commands that may grow memory (SET, HSET, XADD,
XGROUP CREATE, scripts that call them) but still serves reads, XACK, XCLAIM and XTRIM, which are
exactly what drains the stream and frees memory. A consumer therefore keeps reading and acking,
and skips (liveness beats, last errors) or defers (dead-letter moves) what Redis refuses. One
warning when the first write is refused, one when writes are accepted again; the gauge
``shoal_redis_oom`` and the counter ``shoal_redis_writes_refused_total{what}`` show it meanwhile.
"""
import logging
import threading

from streams_app.metrics import consumer as metrics

logger = logging.getLogger("streams_app.consumer")

_lock = threading.Lock()
_refusing = False


def refused(what, exc):
    """Redis refused a write of kind ``what`` (OOM)."""
    global _refusing
    metrics.redis_writes_refused.labels(what).inc()
    with _lock:
        first, _refusing = not _refusing, True
    if first:
        metrics.redis_oom.set(1)
        logger.warning("Redis is at maxmemory and refuses writes (%s: %s); consuming and acking go on, "
                       "liveness beats and last errors are skipped and dead-letter moves deferred until it has room",
                       what, exc)


def accepted():
    """A write went through: the episode, if any, is over."""
    global _refusing
    if not _refusing:
        return
    with _lock:
        was, _refusing = _refusing, False
    if was:
        metrics.redis_oom.set(0)
        logger.warning("Redis accepts writes again (below maxmemory)")


def refusing():
    return _refusing
