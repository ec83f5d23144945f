"""A task message the worker refuses to run (streams_app.tasks.lookup): its result ends FAILED.

The message is dead-lettered at once (RejectMessage), but a poll of its result (``while not
result.is_finished``) would wait for RESULT_TTL if the result stayed READY. So the refusal is the
result's error: FAILED, ``attempts`` 0 (nothing ran), the exception class path of the refusal
(``streams_app.tasks.lookup.TaskRefused``) and its reason. A result that does not exist (an outbox
enqueue not committed yet, an expired one, a message with no usable id) is not created.

Each distinct reason is logged once per process: the consumer's own "handler failed" lines are rate
limited, and a renamed task refuses every message of its name for the same reason. Each refusal is
counted in ``shoal_tasks_refused_total{backend}``.
"""
import logging
import threading

from streams_app.redis.connection import get_connection
from streams_app.tasks import counting, options, results
from streams_app.tasks.api import task_backends

logger = logging.getLogger("streams_app.tasks")

_logged = set()
_lock = threading.Lock()


def refuse(alias, payload, exc):
    """Log ``exc``'s reason (once per distinct one) and mark the message's result FAILED with it."""
    reason = str(exc)
    counting.refused(alias)
    with _lock:
        first = reason not in _logged
        _logged.add(reason)
    if first:
        logger.error("Refused a task message, not run and dead-lettered: %s (each distinct reason is logged once)",
                     reason)
    result_id = payload.get("id") if isinstance(payload, dict) else None
    if not results.valid_id(result_id):
        return
    try:
        ttl = task_backends[payload.get("backend") or alias].config["RESULT_TTL"]
    except Exception:  # noqa: BLE001 -- an unknown or foreign backend: the default lifetime
        ttl = options.DEFAULTS["RESULT_TTL"]
    error = {"exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
             "traceback": f"{type(exc).__name__}: {reason}\n"}
    try:
        results.finished(get_connection(), result_id, "FAILED", ttl, error=error)
    except Exception:  # Redis refused: the dead letter still holds the reason
        logger.exception("Could not mark the result %s of a refused task message FAILED", result_id)
