"""The handler ``runconsumer`` runs on each task message (one consumer per queue: streams_app.tasks.setup).

A task message is data from Redis, not trusted code: its ``task`` path is looked up only in a module
that is already imported or belongs to an installed app, and run only if the attribute found there
is a Django ``Task`` of a Shoal backend. Anything else raises RejectMessage: the entry is
dead-lettered at once with the reason, and nothing of it runs.

One attempt: the result turns RUNNING (one more worker id: Django's ``attempts``), ``task_started``
fires, the function runs (an ``async def`` through asgiref's ``async_to_sync``, as ``Task.call``
does), then the result is SUCCESSFUL with the return value, or the error is recorded and
``task_finished`` fires. A raise is FAILED unless OPTIONS["MAX_RETRIES"] allows another attempt
(then READY, and the consumer retries after its back-off); a FAILED task's message is dead-lettered,
so ``replay`` runs it again. A worker killed mid-task leaves the entry pending: another consumer
takes it over after PENDING_TIMEOUT_MS and runs it again, a second attempt.
"""
import logging
import traceback

from asgiref.sync import async_to_sync, iscoroutinefunction

from streams_app.connection import get_connection
from streams_app.exceptions import RejectMessage
from streams_app.tasks import messages, results
from streams_app.tasks.backend import StreamsBackend, to_task_result
from streams_app.tasks.lookup import find_task
from streams_app.tasks.api import TaskContext, normalize_json, task_backends, task_finished, task_started

logger = logging.getLogger("streams_app.tasks")


def run_message(alias, message):
    """The consumer handler of the queues of the StreamsBackend ``alias``."""
    data = messages.parse(message.payload)
    backend = task_backends[data.get("backend") or alias]
    if not isinstance(backend, StreamsBackend):
        raise RejectMessage(f"backend {data.get('backend')!r} of task {data['task']!r} is not a StreamsBackend")
    task = find_task(data["task"])
    config = backend.config
    ttl = config["RESULT_TTL"]
    conn = get_connection()
    record = results.started(conn, data["id"], message.consumer, ttl)
    if record is None:  # an outbox enqueue (READY written after the commit) or an expired result
        results.create(conn, {**{name: data.get(name) for name in ("id", "task", "backend", "queue", "priority",
                                                                     "takes_context", "args", "kwargs")},
                              "enqueued_at": None, "run_after": None}, ttl)
        record = results.started(conn, data["id"], message.consumer, ttl)
    task = task.using(queue_name=data.get("queue") or task.queue_name, priority=data.get("priority") or 0)
    result = to_task_result(record, task)
    task_started.send(type(backend), task_result=result)
    try:
        value = _call(task, result, data["args"], data["kwargs"])
        value = normalize_json(value)
    except BaseException as exc:  # noqa: BLE001 -- the consumer's rule: every exception is the task's failure
        error = {"exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
                 "traceback": "".join(traceback.format_exception(exc))}
        again = len(record["errors"]) < config["MAX_RETRIES"] and message.deliveries < config["MAX_DELIVERIES"]
        record = results.finished(conn, data["id"], "READY" if again else "FAILED", ttl, error=error)
        if again:
            raise
        task_finished.send(type(backend), task_result=to_task_result(record, task))
        raise RejectMessage(f"task {data['task']} (result {data['id']}) FAILED: {type(exc).__name__}: {exc}") from exc
    record = results.finished(conn, data["id"], "SUCCESSFUL", ttl, return_value=value)
    task_finished.send(type(backend), task_result=to_task_result(record, task))


def _call(task, result, args, kwargs):
    if task.takes_context:
        args = [TaskContext(task_result=result), *args]
    if iscoroutinefunction(task.func):
        return async_to_sync(task.func)(*args, **kwargs)
    return task.func(*args, **kwargs)
