"""The handler ``runconsumer`` runs on each task message (one consumer per queue: streams_app.tasks.setup).

A task message is data from Redis, not trusted code: its ``task`` path is looked up only in a module
that is already imported or belongs to an installed app, and run only if the attribute found there
is a Django ``Task`` of a Shoal backend. Anything else raises RejectMessage: the entry is
dead-lettered at once with the reason, and nothing of it runs.

One attempt: the result turns RUNNING (one more worker id: Django's ``attempts``), ``task_started``
fires, the function runs (sync tasks in a handler thread of the queue's consumer ``tasks:Q``,
``async def`` tasks on the worker's event loop, in the consumer ``tasks:Q:async``), then the result is SUCCESSFUL with the return value, or the error is recorded and
``task_finished`` fires. A raise is FAILED unless OPTIONS["MAX_RETRIES"] allows another attempt
(then READY, and the consumer retries after its back-off); a FAILED task's message is dead-lettered,
so ``replay`` runs it again. A worker killed mid-task leaves the entry pending: another consumer
takes it over after PENDING_TIMEOUT_MS and runs it again, a second attempt.

The sync consumer's handler is a QueueHandler: it writes a task's SUCCESSFUL in the same round trip as
the start of the next task its thread runs, and the chunk's last one before the chunk is acked.
"""
import asyncio
import logging
import threading
import traceback

from asgiref.sync import async_to_sync, iscoroutinefunction

from shoal_common.redisconn import is_cluster
from streams_app import tracing
from streams_app.connection import get_connection
from streams_app.exceptions import RejectMessage
from streams_app.tasks import messages, refusals, results
from streams_app.tasks.backend import StreamsBackend, to_task_result
from streams_app.tasks.lookup import find_task
from streams_app.tasks.api import TaskContext, normalize_json, task_backends, task_finished, task_started

logger = logging.getLogger("streams_app.tasks")


class Attempt:
    """One run of one task message: what both handlers (sync and async) do before and after the call."""

    def __init__(self, alias, message):
        self.message = message
        try:
            self.data = data = messages.parse(message.payload)
            self.backend = task_backends[data.get("backend") or alias]
            if not isinstance(self.backend, StreamsBackend):
                raise RejectMessage(f"backend {data.get('backend')!r} of task {data['task']!r} is not a StreamsBackend")
            tracing.task_run(data["task"], str(data["id"]))  # the CONSUMER span names the task
            task = find_task(data["task"])
        except RejectMessage as exc:
            refusals.refuse(alias, message.payload, exc)  # its result FAILED, not READY until it expires
            raise
        queue, priority = data.get("queue") or task.queue_name, data.get("priority") or 0
        # using() copies and validates the Task: only when the message says otherwise than the Task.
        same = queue == task.queue_name and priority == task.priority
        self.task = task if same else task.using(queue_name=queue, priority=priority)
        self.config = self.backend.config
        self.conn = get_connection()
        self.written = False  # a deferred SUCCESSFUL (QueueHandler): whether it has been written

    def start(self, previous=None):
        """RUNNING, one more attempt; fires task_started. Returns the call's (args, kwargs).

        ``previous``: an Attempt of this thread that succeeded and whose SUCCESSFUL is not written
        yet (QueueHandler): written first, in the same round trip."""
        data, ttl = self.data, self.config["RESULT_TTL"]
        if previous is None:
            self.record = results.started(self.conn, data["id"], self.message.consumer, ttl)
        else:
            done, self.record = results.finished_then_started(
                self.conn, previous.data["id"], "SUCCESSFUL", previous.config["RESULT_TTL"], data["id"],
                self.message.consumer, ttl, return_value=previous.value)
            previous.written = True
            previous.announce(done)
        if self.record is None:  # an outbox enqueue (READY written after the commit) or an expired result
            results.create(self.conn, {**{name: data.get(name) for name in (
                "id", "task", "backend", "queue", "priority", "takes_context", "args", "kwargs")},
                "enqueued_at": None, "run_after": None}, ttl)
            self.record = results.started(self.conn, data["id"], self.message.consumer, ttl)
        result = to_task_result(self.record, self.task)
        task_started.send(type(self.backend), task_result=result)
        args = [TaskContext(task_result=result), *data["args"]] if self.task.takes_context else data["args"]
        return args, data["kwargs"]

    def succeeded(self, value, defer=False):
        """SUCCESSFUL with ``value``; with ``defer``, only checked now (a return value that is not
        JSON is this attempt's failure) and written by the thread's next start or end_chunk."""
        self.value = normalize_json(value)  # TypeError/ValueError for a return value that is not JSON: a failure
        if defer:
            return
        self.announce(results.finished(self.conn, self.data["id"], "SUCCESSFUL", self.config["RESULT_TTL"],
                                       return_value=self.value))

    def announce(self, record):
        """task_finished of the SUCCESSFUL ``record``, once written. A receiver's raise is logged: the
        task succeeded, and when its write was deferred the code running now is another task's."""
        if record is None:
            lost(self, "SUCCESSFUL")
            return
        try:
            task_finished.send(type(self.backend), task_result=to_task_result(record, self.task))
        except Exception:
            logger.exception("task_finished receiver failed for task %s (result %s)", self.data["task"], self.data["id"])

    def failed(self, exc):
        """Record the error; returns the exception for the consumer to raise: ``exc`` itself when the
        task is to be retried (READY), else RejectMessage (FAILED, dead-lettered at once)."""
        data, config = self.data, self.config
        error = {"exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
                 "traceback": "".join(traceback.format_exception(exc))}
        again = len(self.record["errors"]) < config["MAX_RETRIES"] and self.message.deliveries < config["MAX_DELIVERIES"]
        record = results.finished(self.conn, data["id"], "READY" if again else "FAILED", config["RESULT_TTL"],
                                  error=error)
        if record is None:
            lost(self, "READY" if again else "FAILED")
        if again:
            return exc
        if record is not None:
            task_finished.send(type(self.backend), task_result=to_task_result(record, self.task))
        return RejectMessage(f"task {data['task']} (result {data['id']}) FAILED: {type(exc).__name__}: {exc}")


def lost(attempt, status):
    """The attempt's result hash is gone (expired, or Redis lost its data mid-task): its end is not
    written (task_finished.lua writes nothing there), and this line says so."""
    logger.warning("The result %s of task %s is gone from Redis (expired, or Redis lost its data while the task "
                   "ran): its end (%s) was not recorded", attempt.data["id"], attempt.data["task"], status)


def run_message(alias, message, handler=None):
    """The handler of a queue's sync consumer (``tasks:Q``, in a handler thread). ``handler``: the
    QueueHandler calling it, which writes a success with the thread's next start."""
    attempt = Attempt(alias, message)
    defer = handler is not None and handler.defers(attempt)
    previous = handler.take() if handler is not None else None
    try:
        args, kwargs = attempt.start(previous)
    except Exception as exc:
        if previous is not None and not previous.written:
            handler.lose(previous, exc)  # its entry is not to be acked: its task runs again
        raise
    func = attempt.task.func
    try:
        # An async task here was enqueued before its function became async: run it all the same.
        value = async_to_sync(func)(*args, **kwargs) if iscoroutinefunction(func) else func(*args, **kwargs)
        attempt.succeeded(value, defer=defer)
    except RejectMessage:
        raise
    except BaseException as exc:  # noqa: BLE001 -- the consumer's rule: every exception is the task's failure
        outcome = attempt.failed(exc)
        if outcome is exc:
            raise
        raise outcome from exc
    if defer:
        handler.put(attempt)


class QueueHandler:
    """The handler streams_app.tasks.setup registers for a queue's sync consumer: ``run_message``,
    with one round trip per task instead of two. A success's SUCCESSFUL is written together with
    the start of the next task this handler thread runs (results.finished_then_started), or by
    ``end_chunk``, which run_chunk calls in the same thread once the chunk's messages ran, before
    they are acked: a result is SUCCESSFUL only once its task ran, and written before its ack.

    Not deferred: on a cluster (the two results are in different slots), and under an idempotency
    guard (a guard marks the entry done at the chunk's end, or in the task's own transaction,
    which must not come before its SUCCESSFUL is written).
    """

    shoal_handler_name = ""  # the Handler the admin shows (registry.describe_handler); set by setup.install

    def __init__(self, alias):
        self.alias = alias
        self.local = threading.local()  # per handler thread: .pending, the success not yet written

    def __call__(self, message):
        return run_message(self.alias, message, self)

    def defers(self, attempt):
        return attempt.config["IDEMPOTENT"] is None and not is_cluster(attempt.conn)

    def put(self, attempt):
        self.local.pending = attempt

    def lose(self, attempt, exc):
        self.local.lost = [*getattr(self.local, "lost", []), (attempt.message, exc)]

    def take(self):
        pending, self.local.pending = getattr(self.local, "pending", None), None
        return pending

    def end_chunk(self):
        """Write this thread's last success of the chunk. Returns [(message, exception)] of the
        entries whose SUCCESSFUL could not be written: not to be acked (their task runs again)."""
        lost, self.local.lost = getattr(self.local, "lost", []), []
        pending = self.take()
        if pending is None:
            return lost
        try:
            record = results.finished(pending.conn, pending.data["id"], "SUCCESSFUL", pending.config["RESULT_TTL"],
                                      return_value=pending.value)
        except Exception as exc:  # noqa: BLE001 -- Redis refused or went away: the entry stays pending
            return [*lost, (pending.message, exc)]
        pending.announce(record)
        return lost


async def run_message_async(alias, message):
    """The handler of a queue's async consumer (``tasks:Q:async``, on the worker's event loop): the
    Redis writes and signals in a thread, the task awaited on the loop."""
    attempt = await asyncio.to_thread(Attempt, alias, message)
    args, kwargs = await asyncio.to_thread(attempt.start)
    func = attempt.task.func
    try:
        value = await func(*args, **kwargs) if iscoroutinefunction(func) else await asyncio.to_thread(func, *args, **kwargs)
        await asyncio.to_thread(attempt.succeeded, value)
    except asyncio.CancelledError:
        raise  # the worker's shutdown (or the task's own cancel): the consumer decides, the entry stays pending
    except RejectMessage:
        raise
    except BaseException as exc:  # noqa: BLE001
        outcome = await asyncio.to_thread(attempt.failed, exc)
        if outcome is exc:
            raise
        raise outcome from exc
