"""``streams_app.tasks.cancel(result_id)``: a queued task that will never run (Celery's ``revoke``).

A READY result (queued, deferred with ``run_after``, or waiting for its retry) becomes FAILED at once
with a TaskCancelled error and a ``cancelled`` mark, in one script (task_cancel.lua). Every start of a
task is a script too, which never starts a result so marked: a worker that already read the message, or
reads it later, acks it unrun (streams_app/tasks/runner.py). Nothing looks for the message itself,
however many workers hold it: the mark is on the result, the one place every attempt goes through.
A result that is RUNNING, finished or unknown cannot be cancelled: False.
"""
import logging

from streams_app.redis.connection import get_connection
from streams_app.tasks import options, results
from streams_app.tasks.api import task_backends
from streams_app.tasks.exceptions import TaskCancelled

logger = logging.getLogger("streams_app.tasks")

REASON = "cancelled before it started (streams_app.tasks.cancel): it was not run"
REASON_RETRY = "cancelled while it waited for its retry (streams_app.tasks.cancel): no further attempt was run"


def cancel(result_id):
    """True when the task of ``result_id`` will now never run (cancelled by this call or an earlier one);
    False for a task that is running or finished and for an unknown id."""
    conn = get_connection()
    record = results.get(conn, result_id)
    if record is None:
        return False
    try:  # kept as long as its backend keeps results
        ttl = task_backends[record["backend"]].config["RESULT_TTL"]
    except Exception:  # noqa: BLE001 -- a backend no longer in TASKS: the default lifetime
        ttl = options.DEFAULTS["RESULT_TTL"]
    error = {"exception_class_path": f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}",
             "traceback": f"{TaskCancelled.__name__}: {REASON_RETRY if record['worker_ids'] else REASON}\n"}
    done = results.cancel(conn, result_id, error, ttl)
    if done:
        logger.info("Task result %s cancelled: its task will not run", result_id)
    return done
