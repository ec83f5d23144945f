"""``streams_app.tasks.StreamsBackend``: Django's Tasks on Shoal's streams.

``enqueue`` validates the task as Django does, normalises its arguments (what is not JSON raises
here, and nothing is written), writes a READY result and publishes the message to the queue's
stream (streams_app.tasks.messages); ``run_after`` defers it with ``publish(..., run_after=)``.
With ``OPTIONS["OUTBOX"]`` the message goes through the transactional outbox instead, so it is
published only if the caller's transaction commits (and its READY result is written, and
``task_enqueued`` sent, then too).
The consumers of the queues are declared by streams_app.tasks.setup and run by ``runconsumer``.
"""
import json
import logging
import secrets
from datetime import timedelta

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from streams_app import tracing
from streams_app.redis.connection import get_connection
from streams_app.exceptions import RejectMessage
from streams_app.publishing.producer import diverted, publish
from shoal_common.redisconn import is_cluster
from streams_app.tasks import counting, messages, options, results, retries, sending
from streams_app.tasks.lookup import find_task
from streams_app.tasks.api import (
    BaseTaskBackend,
    InvalidTask,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    tasks_logger,
)
from streams_app.tasks.exceptions import EnqueueManyError
from streams_app.tasks.signalling import listened

# Tasks per MULTI/EXEC round trip of enqueue_many.
BULK_BATCH = 500


class StreamsBackend(BaseTaskBackend):
    """Django's Tasks on Shoal: each queue of ``TASKS[alias]["QUEUES"]`` is a stream, ``tasks:<queue>``, read by
    the group ``workers`` that ``runconsumer`` runs; results are Redis hashes. Options and setup: docs/tasks.md.

    ``TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend", "QUEUES": ["default"]}}``
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True
    # Django's @task(...) passes the arguments it does not know to task_class: max_attempts, backoff, retry_on, timeout.
    task_class = retries.ShoalTask

    def __init__(self, alias, params):
        if not options.valid_queues(params):
            # Django would take a string as its letters: a task of queue "emails" would then fail to
            # import with "Queue 'emails' is not valid", far from the setting that is wrong.
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES'] must be a non-empty list of queue names, not "
                                       f"{params.get('QUEUES')!r} (streams_app.E062; see docs/tasks.md, \"Settings\").")
        super().__init__(alias, params)
        self.config = options.merged(self.options)

    def validate_task(self, task):
        if isinstance(task.run_after, timedelta):
            # using(run_after=timedelta(minutes=5)): from now, as publish(..., run_after=) takes it. Django's
            # own check would fail on it with an AttributeError; a Task is frozen, hence object.__setattr__.
            if task.run_after < timedelta(0):
                raise InvalidTask(f"run_after must not be a negative timedelta ({task.run_after!r}).")
            object.__setattr__(task, "run_after", timezone.now() + task.run_after)
        super().validate_task(task)
        retries.validate(task)
        # A queue name becomes part of a stream name (":high" and ":low" name its bands) and of
        # runconsumer's STREAM:GROUP selector.
        if not task.queue_name or any(char.isspace() or char == ":" for char in task.queue_name):
            raise InvalidTask(f"Queue name {task.queue_name!r} must be a non-empty name without whitespace or ':'.")

    def enqueue(self, task, args, kwargs):
        self.validate_task(task)
        result, stream, payload, record = self._prepared(task, args, kwargs)
        with tracing.task(task.module_path, result.id):  # the publish span names the task
            return self._enqueue(task, result, stream, payload, record)

    def _enqueue(self, task, result, stream, payload, record):
        ttl = self.config["RESULT_TTL"]
        if diverted():  # a test's capture_publishes: the message is recorded, and no result goes to Redis
            publish(stream, payload, key=result.id, outbox=self.config["OUTBOX"], using=self.config["DATABASE"],
                    run_after=task.run_after)
            self._enqueued(result)
            return result
        if self.config["OUTBOX"]:
            using = self.config["DATABASE"]
            publish(stream, payload, key=result.id, outbox=True, using=using, run_after=task.run_after)
            # The READY result is written once the row is committed: a rolled-back enqueue leaves none.
            transaction.on_commit(lambda: results.create(get_connection(), record, ttl), using=using)
            self._enqueued(result)
            return result
        conn = get_connection()
        if (task.run_after is None and not tracing.active() and not is_cluster(conn)
                and self._send(conn, [(result, stream, payload, record)])):
            self._enqueued(result)
            return result
        results.create(conn, record, ttl)
        try:
            publish(stream, payload, key=result.id, run_after=task.run_after)
        except BaseException:
            results.discard(conn, result.id, task.queue_name)  # nothing was published: no result that never runs
            raise
        self._enqueued(result)
        return result

    def _prepared(self, task, args, kwargs):
        """(TaskResult, stream, payload, results record) of one enqueue; TypeError/ValueError, and
        nothing written, for arguments that are not JSON."""
        result = TaskResult(  # normalises args and kwargs: TypeError/ValueError for what is not JSON
            task=task, id=secrets.token_hex(16), status=TaskResultStatus.READY, enqueued_at=timezone.now(),
            started_at=None, last_attempted_at=None, finished_at=None, args=args, kwargs=kwargs,
            backend=self.alias, errors=[], worker_ids=[],
        )
        _finite(result.args, result.kwargs)
        payload = messages.payload(result)
        record = {**payload, "enqueued_at": result.enqueued_at, "run_after": task.run_after}
        stream = messages.stream_for(task.queue_name, task.priority, iscoroutinefunction(task.func))
        return result, stream, payload, record

    def _send(self, conn, prepared):
        """The READY results and messages of ``prepared`` in one round trip (streams_app/tasks/sending.py).
        True when written; False when Redis refused them, nothing written (the caller's one-by-one
        path then raises Redis's reason as ``publish`` words it)."""
        return sending.send(conn, prepared, self.config["RESULT_TTL"]) is not None

    def enqueue_many(self, task, calls):
        """``enqueue(task, args, kwargs)`` for each (args, kwargs) of ``calls``: one TaskResult each, in
        order, and one round trip per BULK_BATCH tasks (one script: each batch whole or not at all).
        Everything is validated before anything is written. A deferred task (run_after), OPTIONS
        OUTBOX, a test's capture_publishes, tracing and a cluster enqueue one by one."""
        self.validate_task(task)
        prepared = [self._prepared(task, args, kwargs) for args, kwargs in calls]
        one_by_one = diverted() or self.config["OUTBOX"] or task.run_after is not None or tracing.active()
        conn = None if one_by_one else get_connection()
        if conn is None or is_cluster(conn):
            return [self.enqueue(task, result.args, result.kwargs) for result, *_ in prepared]
        done = []
        for start in range(0, len(prepared), BULK_BATCH):
            batch = prepared[start:start + BULK_BATCH]
            if self._send(conn, batch):
                done += [result for result, *_ in batch]
                for result, *_ in batch:
                    self._enqueued(result)
            else:
                raise EnqueueManyError(f"Redis refused batch {start // BULK_BATCH + 1} of enqueue_many (tasks "
                                       f"{start} to {start + len(batch) - 1}); the first {len(done)} tasks were "
                                       "enqueued, this batch and the rest were not.", done)
        return done

    def _enqueued(self, result):
        if self.config["OUTBOX"]:
            # task_enqueued once the row commits: a rolled-back enqueue is no task, and a listener must not count it.
            transaction.on_commit(lambda: self._announce(result), using=self.config["DATABASE"])
        else:
            self._announce(result)

    def _announce(self, result):
        counting.enqueued(result.task.module_path, result.task.queue_name)
        if listened(task_enqueued, type(self)):
            task_enqueued.send(type(self), task_result=result)
        elif tasks_logger.isEnabledFor(logging.DEBUG):  # Django's own receiver's line
            tasks_logger.debug("Task id=%s path=%s enqueued backend=%s", result.id, result.task.module_path,
                               result.backend)

    def get_result(self, result_id):
        try:
            record = results.get(get_connection(), result_id)
            if record is not None:
                return to_task_result(record)
        except (ValueError, TypeError) as exc:  # a hash written by something else under the result's key
            raise TaskResultDoesNotExist(f"Task result {result_id!r} is stored in a form this backend cannot read "
                                         f"({type(exc).__name__}: {exc}).") from exc
        raise TaskResultDoesNotExist(f"No task result {result_id!r}: never enqueued here, or expired "
                                     f"(results are kept OPTIONS['RESULT_TTL'] = {self.config['RESULT_TTL']} s).")


def _finite(args, kwargs):
    """ValueError for NaN or infinity in the arguments, as Django's normalisation raises for bytes that
    are not text: JSON has no such numbers (the publish would refuse them later, as a PublishError)."""
    try:
        json.dumps([args, kwargs], allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"Task arguments must be JSON, which has no NaN or infinity: {args!r}, {kwargs!r}") from exc


def to_task_result(record, task=None):
    """The Django TaskResult of a results record; ``task`` when the caller has it already."""
    if task is None:
        task = _resolve(record)
    elif record["run_after"] is not None and task.run_after != record["run_after"]:
        # The worker's Task is the function's; the result's run_after (a deferred run, a periodic tick)
        # is what task_result.task.run_after must say in the task's context and Django's signals.
        task = task.using(run_after=record["run_after"])
    result = TaskResult(
        task=task, id=record["id"], status=TaskResultStatus(record["status"]), enqueued_at=record["enqueued_at"],
        started_at=record["started_at"], last_attempted_at=record["last_attempted_at"],
        finished_at=record["finished_at"], args=record["args"], kwargs=record["kwargs"],
        backend=record["backend"], errors=[TaskError(**error) for error in record["errors"]],
        worker_ids=list(record["worker_ids"]),
    )
    object.__setattr__(result, "_return_value", record["return_value"])
    return result


def _resolve(record):
    try:
        task = find_task(record["task"])
    except RejectMessage as exc:  # the code changed since: the result is there, its task is not
        raise TaskResultDoesNotExist(f"Task result {record['id']!r} is stored, but {exc}") from exc
    changes = {"queue_name": record["queue"] or task.queue_name, "priority": record["priority"]}
    if record["run_after"] is not None:
        changes["run_after"] = record["run_after"]
    return task.using(**changes)
