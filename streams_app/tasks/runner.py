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
import json
import logging
import threading
import time
import traceback
from datetime import timedelta

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.utils import timezone

from shoal_common.redisconn import is_cluster
from streams_app import tracing
from streams_app.redis.connection import get_connection
from streams_app.exceptions import RejectMessage
from streams_app.publishing.producer import publish
from streams_app.tasks import counting, messages, refusals, results, retries, timelimits
from streams_app.tasks.backend import StreamsBackend, to_task_result
from streams_app.tasks.exceptions import ReturnValueNotJSON
from streams_app.tasks.lookup import find_task
from streams_app.tasks.signalling import listened
from streams_app.tasks.api import (
    TaskContext,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
    tasks_logger,
)

logger = logging.getLogger("streams_app.tasks")

BATCHED_START_SECONDS = 0.05
"""How long the tasks a chunk turns RUNNING in one round trip are expected to run in all, from their
paths' past runs: beyond that a task starts when it runs (one round trip, as ever). Should the batch run
past twice that all the same (a usually quick task that was slow this once), the tasks of it not reached
yet are taken back when that task ends and start one by one, in their order. Until then the batch's
results show RUNNING, the finished ones too: nothing interrupts the running task to write them."""


def encode_return(value):
    """The JSON a result holds for a task's return value. ReturnValueNotJSON for a value that is not JSON
    (Django's normalize_json) or holds NaN or an infinity, which JSON has no spelling for."""
    try:
        return json.dumps(normalize_json(value), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: a list that holds itself
        # Not the value's repr: it may raise, or be megabytes (an int of 5,000 digits).
        raise ReturnValueNotJSON(f"the task's return value (a {type(value).__qualname__}) cannot be stored as "
                                 f"JSON ({type(exc).__name__}: {str(exc)[:200]}): return None, a bool, a finite "
                                 "number, a str, or lists and dicts of them") from exc


class Cancelled(Exception):
    """Attempt.start found the result cancelled (streams_app/tasks/cancelling.py): the handler returns
    without running the task, so its entry is acked."""


class StartFailed(Exception):
    """A task_started receiver raised: the attempt's failure, recorded as if the task had raised it."""

    def __init__(self, exc):
        super().__init__(str(exc))
        self.exc = exc


class Attempt:
    """One run of one task message: what both handlers (sync and async) do before and after the call."""

    def __init__(self, alias, message, refuse=True):
        self.message = message
        try:
            self.data = data = messages.parse(message.payload)
            self.backend = task_backends[data.get("backend") or alias]
            if not isinstance(self.backend, StreamsBackend):
                raise RejectMessage(f"backend {data.get('backend')!r} of task {data['task']!r} is not a StreamsBackend")
            if refuse:  # the handler's own call, in the message's CONSUMER span: the span names the task
                tracing.task_run(data["task"], str(data["id"]))
            task = find_task(data["task"])
        except RejectMessage as exc:
            if refuse:  # QueueHandler.begin_chunk only looks: the handler's own call refuses it
                refusals.refuse(alias, message.payload, exc)  # its result FAILED, not READY until it expires
            raise
        queue, priority = data.get("queue") or task.queue_name, data.get("priority") or 0
        # using() copies and validates the Task: only when the message says otherwise than the Task.
        same = queue == task.queue_name and priority == task.priority
        self.task = task if same else task.using(queue_name=queue, priority=priority)
        self.sender = type(self.backend)
        self.config = self.backend.config
        self.conn = get_connection()
        self.written = False  # a deferred SUCCESSFUL (QueueHandler): whether it has been written
        self.errors_so_far = 0  # the result's errors when this attempt started (MAX_RETRIES)

    def counted(self, counter, *status):
        counter(*status, self.data["task"], self.task.queue_name)

    def listened(self, signal):
        """Whether ``signal`` has a receiver for this backend besides Django's own, which only logs:
        Django's TaskResult is built only then."""
        return listened(signal, self.sender)

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
                self.message.consumer, ttl, return_json=previous.value)
            previous.written = True
            previous.announce(done)
        if self.record is None:  # an outbox enqueue (READY written after the commit) or an expired result
            results.create(self.conn, {**{name: data.get(name) for name in (
                "id", "task", "backend", "queue", "priority", "takes_context", "args", "kwargs")},
                "enqueued_at": messages.moment(data, "enqueued_at"),
                "run_after": messages.moment(data, "run_after")}, ttl)
            self.record = results.started(self.conn, data["id"], self.message.consumer, ttl)
        if self.record["cancelled"]:  # streams_app.tasks.cancel: never started, acked unrun
            logger.info("Task %s (result %s) was cancelled: not run", data["task"], data["id"])
            raise Cancelled
        self.errors_so_far = len(self.record["errors"])
        self.counted(counting.started)
        if not (self.task.takes_context or self.listened(task_started)):
            log_state(self, "RUNNING")
            return data["args"], data["kwargs"]
        result = to_task_result(self.record, self.task)
        try:
            task_started.send(self.sender, task_result=result)
        except Exception as exc:  # the result is RUNNING: it must not stay so, whatever the consumer does next
            raise StartFailed(exc) from exc
        args = [TaskContext(task_result=result), *data["args"]] if self.task.takes_context else data["args"]
        return args, data["kwargs"]

    def succeeded(self, value, defer=False):
        """SUCCESSFUL with ``value``; with ``defer``, only encoded now (a return value that is not
        JSON is this attempt's failure) and written by the thread's next start or end_chunk."""
        self.value = encode_return(value)
        if defer:
            return
        self.announce(results.finished(self.conn, self.data["id"], "SUCCESSFUL", self.config["RESULT_TTL"],
                                       return_json=self.value))

    def announce(self, record):
        """task_finished of the SUCCESSFUL ``record``, once written. A receiver's raise is logged: the
        task succeeded, and when its write was deferred the code running now is another task's."""
        if record is None:
            lost(self, "SUCCESSFUL")
            return
        self.counted(counting.finished, "SUCCESSFUL")
        if not self.listened(task_finished):
            log_state(self, "SUCCESSFUL")
            return
        try:
            task_finished.send(self.sender, task_result=to_task_result(record, self.task))
        except Exception:
            logger.exception("task_finished receiver failed for task %s (result %s)", self.data["task"], self.data["id"])

    def failed(self, exc):
        """Record the error; returns what the handler does next: None when the task is retried as a
        deferred message (the entry that failed is acked: a waiting retry holds no pending entry),
        ``exc`` itself for the consumer to retry the entry (under an idempotency guard, whose mark a
        finished entry would set, and when the retry could not be published), else RejectMessage
        (FAILED, dead-lettered at once)."""
        data, config = self.data, self.config
        attempt = self.errors_so_far + 1  # the attempts that failed, this one included
        max_attempts, backoff, retry_on = retries.policy(self.task, config)
        again = (attempt < max_attempts and not isinstance(exc, ReturnValueNotJSON)
                 and isinstance(exc, (retries.Retry, *retry_on)))
        guarded = config["IDEMPOTENT"] is not None
        if guarded and self.message.deliveries >= config["MAX_DELIVERIES"]:
            again = False
        delay = problem = None
        if again and not guarded:
            try:
                delay = retries.delay(backoff, attempt, exc)
            except retries.BackoffError as found:
                again, problem = False, found
        record = results.finished(self.conn, data["id"], "READY" if again or problem else "FAILED",
                                  config["RESULT_TTL"], error=_error(exc))
        if problem is not None and record is not None:  # the backoff's own error after the attempt's
            record = results.finished(self.conn, data["id"], "FAILED", config["RESULT_TTL"], error=_error(problem))
        if record is None:
            lost(self, "READY" if again else "FAILED")
        if again and guarded:
            return exc
        if again:
            return self._retry_later(exc, attempt, max_attempts, delay)
        if record is not None:
            self.counted(counting.finished, "FAILED")
            if self.listened(task_finished):
                task_finished.send(self.sender, task_result=to_task_result(record, self.task))
            elif tasks_logger.isEnabledFor(logging.ERROR):  # Django's receiver logs a failure with its traceback
                tasks_logger.error("Task id=%s path=%s state=%s", data["id"], data["task"], "FAILED", exc_info=exc)
        cause = problem if problem is not None else exc
        return RejectMessage(f"task {data['task']} (result {data['id']}) FAILED: {type(cause).__name__}: {cause}")

    def _retry_later(self, exc, attempt, max_attempts, delay):
        """Publish the task's message again, due in ``delay`` seconds; None (ack the failed entry), or ``exc``
        when the publish failed: the consumer then retries the entry itself, so nothing is lost."""
        data, task = self.data, self.task
        stream = messages.stream_for(task.queue_name, task.priority, iscoroutinefunction(task.func))
        try:
            publish(stream, self.message.payload, key=data["id"],
                    run_after=timedelta(seconds=delay) if delay > 0 else None)
        except Exception:  # noqa: BLE001 -- Redis refused: the pending entry is the retry instead
            logger.warning("Could not publish the retry of task %s (result %s); the consumer retries its entry",
                           data["task"], data["id"], exc_info=True)
            return exc
        logger.info("Task %s (result %s): attempt %d of %d failed (%s: %s); retried in %.1f s", data["task"],
                    data["id"], attempt, max_attempts, type(exc).__name__, exc, delay)
        return None


def _error(exc):
    return {"exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "traceback": "".join(traceback.format_exception(exc))}


def log_state(attempt, status):
    """Django's own receivers' line, written where no TaskResult was built for them."""
    if tasks_logger.isEnabledFor(logging.INFO):
        tasks_logger.info("Task id=%s path=%s state=%s", attempt.data["id"], attempt.data["task"], status)


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
    except Cancelled:
        return
    except StartFailed as failure:
        outcome = attempt.failed(failure.exc)
        if outcome is None:
            return
        if outcome is failure.exc:  # the consumer retries the entry itself
            raise failure.exc from None
        raise outcome from failure.exc
    except Exception as exc:
        if previous is not None and not previous.written:
            handler.lose(previous, exc)  # its entry is not to be acked: its task runs again
        raise
    func = attempt.task.func
    watch = _watch(attempt)
    began = time.perf_counter()
    try:
        # An async task here was enqueued before its function became async: run it all the same.
        value = async_to_sync(func)(*args, **kwargs) if iscoroutinefunction(func) else func(*args, **kwargs)
        if timelimits.ended_elsewhere(watch):  # past its timeout: the watchdog wrote its end, and settled the entry
            return
        attempt.succeeded(value, defer=defer)
    except RejectMessage:
        if timelimits.ended_elsewhere(watch):
            return
        raise
    except BaseException as exc:  # noqa: BLE001 -- the consumer's rule: every exception is the task's failure
        if timelimits.ended_elsewhere(watch):
            return
        outcome = attempt.failed(exc)
        if outcome is None:  # retried as a deferred message: this entry is done
            return
        if outcome is exc:
            raise
        raise outcome from exc
    finally:
        if handler is not None:
            handler.timed(attempt.data["task"], time.perf_counter() - began)
    if defer:
        handler.put(attempt)


class QueueHandler:
    """The handler streams_app.tasks.setup registers for a queue's sync consumer: ``run_message``,
    with the results of a whole chunk written in two round trips instead of one or two per task.

    ``begin_chunk`` (run_chunk calls it before the chunk's first message, in the handler thread)
    turns the chunk's results RUNNING in one round trip (results.started_many: one more attempt and
    worker id each); each call runs its task and keeps the success; ``end_chunk`` (once the chunk's
    messages ran, before they are acked) writes the successes in one round trip (results.succeeded_many,
    with each task's own start and finish times), and takes back the attempts of the tasks the chunk
    did not reach (its time budget ran out: they are handed back and run in a later chunk). A result is
    SUCCESSFUL only once its task ran, and written before its entry is acked; a failure is written at
    once, as before. A worker killed mid-chunk leaves the chunk's entries pending, and their results
    RUNNING with one attempt more: another worker takes them over and runs them again.

    A chunk is run task by task (one round trip each: the SUCCESSFUL of a task goes with the start of
    the next, results.finished_then_started) when Django's task_started or task_finished has a
    receiver (each receives its TaskResult in Django's order, the result as written), for a task
    that takes its context, and for a result that does not exist yet (an outbox enqueue whose READY is
    written after the commit). Not chunked at all: on a cluster (the results are in different slots)
    and under an idempotency guard (a guard marks the entry done at the chunk's end, or in the task's
    own transaction, which must not come before its SUCCESSFUL is written).
    """

    # Chunks of about this much task time (consuming/loop.py; 5 ms for other handlers): a chunk's starts
    # and successes are a round trip each, so 1 ms tasks in 5 ms chunks spent more on them than running.
    # Within BATCHED_START_SECONDS, so a chunk of quick tasks starts in one batch.
    shoal_chunk_seconds = 0.02
    shoal_handler_name = ""  # the Handler the admin shows (registry.describe_handler); set by setup.install

    def __init__(self, alias):
        self.alias = alias
        # Per handler thread: .pending (the success not yet written), .begun (this chunk's attempts
        # started by begin_chunk, by entry id), .done (their successes), .lost.
        self.local = threading.local()
        self.durations = {}  # task path -> its runs' moving average (s), shared by the handler threads

    def __call__(self, message):
        begun = getattr(self.local, "begun", None)
        attempt = begun.get(message.id) if begun else None
        if attempt is None:
            return run_message(self.alias, message, self)
        if time.perf_counter() - self.local.batch_began > 2 * BATCHED_START_SECONDS:
            # A task ahead ran long: those not reached must not go on showing RUNNING; each starts as it runs.
            self._give_back(begun)
            return run_message(self.alias, message, self)
        del begun[message.id]
        return self._run_begun(attempt)

    def defers(self, attempt):
        return deferrable(attempt)

    def timed(self, path, seconds):
        """How long a run of the task at ``path`` took (a moving average per path, for begin_chunk)."""
        previous = self.durations.get(path)
        self.durations[path] = seconds if previous is None else 0.8 * previous + 0.2 * seconds

    def begin_chunk(self, chunk):
        """Start the attempts of the messages of ``chunk`` that can be run in one batch (see the class)."""
        self.local.begun, self.local.done = begin(self, chunk), []
        self.local.batch_began = time.perf_counter()

    def _run_begun(self, attempt):
        """Run the task of an attempt begin_chunk started; its success is written by end_chunk."""
        data, func = attempt.data, attempt.task.func
        tracing.task_run(data["task"], str(data["id"]))  # begun by begin_chunk, outside this message's span
        watch = _watch(attempt)
        started, began = now_iso(), time.perf_counter()
        try:
            if iscoroutinefunction(func):  # enqueued before its function became async
                value = async_to_sync(func)(*data["args"], **data["kwargs"])
            else:
                value = func(*data["args"], **data["kwargs"])
            if timelimits.ended_elsewhere(watch):  # past its timeout: the watchdog wrote its end
                return
            value = encode_return(value)
        except RejectMessage:
            if timelimits.ended_elsewhere(watch):
                return
            raise
        except BaseException as exc:  # noqa: BLE001 -- the consumer's rule: every exception is the task's failure
            if timelimits.ended_elsewhere(watch):
                return
            outcome = attempt.failed(exc)
            if outcome is None:  # retried as a deferred message: this entry is done
                return
            if outcome is exc:
                raise
            raise outcome from exc
        finally:
            self.timed(data["task"], time.perf_counter() - began)
        self.local.done.append((attempt, started, now_iso(), value))

    def put(self, attempt):
        self.local.pending = attempt

    def lose(self, attempt, exc):
        self.local.lost = [*getattr(self.local, "lost", []), (attempt.message, exc)]

    def take(self):
        pending, self.local.pending = getattr(self.local, "pending", None), None
        return pending

    def end_chunk(self):
        """Write this thread's successes of the chunk not written yet. Returns [(message, exception)] of
        the entries whose SUCCESSFUL could not be written: not to be acked (their task runs again)."""
        lost, self.local.lost = getattr(self.local, "lost", []), []
        lost += self._end_begun()
        pending = self.take()
        if pending is None:
            return lost
        try:
            record = results.finished(pending.conn, pending.data["id"], "SUCCESSFUL", pending.config["RESULT_TTL"],
                                      return_json=pending.value)
        except Exception as exc:  # noqa: BLE001 -- Redis refused or went away: the entry stays pending
            return [*lost, (pending.message, exc)]
        pending.announce(record)
        return lost

    def _give_back(self, begun):
        give_back(begun)

    def _end_begun(self):
        begun, done = getattr(self.local, "begun", None), getattr(self.local, "done", None)
        self.local.begun, self.local.done = None, []
        if begun:  # not reached: handed back by the chunk, to run later as the same attempt's first go
            give_back(begun)
        return write_successes(done or [])


def deferrable(attempt):
    """Whether the attempt's result writes may wait to go with others' (not under an idempotency guard,
    whose mark must not come before the SUCCESSFUL; not on a cluster, where results are in other slots)."""
    return attempt.config["IDEMPOTENT"] is None and not is_cluster(attempt.conn)


def begin(handler, chunk):
    """Turn RUNNING, in one round trip, the attempts of the prefix of ``chunk`` known to be quick
    (BATCHED_START_SECONDS in all, by ``handler``'s timings); {entry id: Attempt} of those started."""
    if is_cluster(get_connection()):
        return {}
    attempts, budget = [], BATCHED_START_SECONDS
    for message in chunk:
        try:
            attempt = Attempt(handler.alias, message, refuse=False)
        except Exception:  # noqa: BLE001 -- refused or broken: the handler's call raises it, as ever
            break
        # Only a prefix of tasks known to be quick: a result must not show RUNNING long before its
        # task runs (a slow task ahead of it, or one this handler never timed, ends the batch).
        expected = handler.durations.get(attempt.data["task"])
        if expected is None or expected > budget:
            break
        budget -= expected
        if (attempt.task.takes_context or not handler.defers(attempt) or message.consumer != chunk[0].consumer
                or attempt.listened(task_started) or attempt.listened(task_finished)):
            continue
        attempts.append(attempt)
    if not attempts:
        return {}
    try:
        started = results.started_many(attempts[0].conn, [a.data["id"] for a in attempts], chunk[0].consumer,
                                       [a.config["RESULT_TTL"] for a in attempts])
    except Exception:  # noqa: BLE001 -- Redis refused: each task starts alone, and says why
        logger.debug("Could not start a chunk of %d tasks in one round trip", len(attempts), exc_info=True)
        return {}
    begun = {}
    for attempt, (number, errors) in zip(attempts, started):
        if number:  # 0: no result to start (created and started by the task's own call)
            attempt.number, attempt.errors_so_far = number, errors
            attempt.counted(counting.started)
            log_state(attempt, "RUNNING")
            begun[attempt.message.id] = attempt
    return begun


def give_back(begun):
    """Take back the starts of the attempts in ``begun`` (by entry id) that did not run, and empty it."""
    first = next(iter(begun.values()))
    try:
        results.unstarted_many(first.conn, [(a.data["id"], a.number) for a in begun.values()], first.message.consumer)
    except Exception:  # noqa: BLE001 -- they run all the same, one attempt more on the record
        logger.warning("Could not take back the start of %d tasks not run yet", len(begun), exc_info=True)
    begun.clear()


def write_successes(done):
    """SUCCESSFUL for each (attempt, started_at, finished_at, return JSON) of ``done``, in one round trip.
    Returns [(message, exception)] of the entries whose success could not be written (not to be acked)."""
    if not done:
        return []
    try:
        written = results.succeeded_many(done[0][0].conn, [
            (a.data["id"], a.config["RESULT_TTL"], a.number, started, finished, value) for a, started, finished, value in done])
    except Exception as exc:  # noqa: BLE001 -- Redis refused or went away: the entries stay pending
        return [(attempt.message, exc) for attempt, *_ in done]
    for (attempt, *_), ok in zip(done, written):
        if ok:
            attempt.counted(counting.finished, "SUCCESSFUL")
            log_state(attempt, "SUCCESSFUL")
        else:
            lost(attempt, "SUCCESSFUL")
    return []


def now_iso():
    return timezone.now().isoformat()


def _watch(attempt):
    """The time limit's watch over ``attempt`` (its task about to run in this thread), or None: no limit."""
    seconds = retries.timeout(attempt.task, attempt.config)
    return timelimits.watch(attempt, seconds) if seconds else None
