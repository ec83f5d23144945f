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
from datetime import timedelta

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import get_random_string

from streams_app import tracing
from streams_app.connection import get_connection
from streams_app.exceptions import RejectMessage
from streams_app.producer import diverted, publish
from streams_app.tasks import messages, options, results
from streams_app.tasks.lookup import find_task
from streams_app.tasks.api import (
    BaseTaskBackend,
    InvalidTask,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)


class StreamsBackend(BaseTaskBackend):
    """Django's Tasks on Shoal: each queue of ``TASKS[alias]["QUEUES"]`` is a stream, ``tasks:<queue>``, read by
    the group ``workers`` that ``runconsumer`` runs; results are Redis hashes. Options and setup: docs/tasks.md.

    ``TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend", "QUEUES": ["default"]}}``
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

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
        # A queue name becomes part of a stream name (":high" and ":low" name its bands) and of
        # runconsumer's STREAM:GROUP selector.
        if not task.queue_name or any(char.isspace() or char == ":" for char in task.queue_name):
            raise InvalidTask(f"Queue name {task.queue_name!r} must be a non-empty name without whitespace or ':'.")

    def enqueue(self, task, args, kwargs):
        self.validate_task(task)
        result_id = get_random_string(32)
        with tracing.task(task.module_path, result_id):  # the publish span names the task
            return self._enqueue(task, args, kwargs, result_id)

    def _enqueue(self, task, args, kwargs, result_id):
        result = TaskResult(  # normalises args and kwargs: TypeError/ValueError for what is not JSON
            task=task, id=result_id, status=TaskResultStatus.READY, enqueued_at=timezone.now(),
            started_at=None, last_attempted_at=None, finished_at=None, args=args, kwargs=kwargs,
            backend=self.alias, errors=[], worker_ids=[],
        )
        _finite(result.args, result.kwargs)
        payload = messages.payload(result)
        record = {**{name: payload[name] for name in ("id", "task", "backend", "queue", "priority", "takes_context",
                                                      "args", "kwargs")},
                  "enqueued_at": result.enqueued_at, "run_after": task.run_after}
        stream = messages.stream_for(task.queue_name, task.priority, iscoroutinefunction(task.func))
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
        results.create(conn, record, ttl)
        try:
            publish(stream, payload, key=result.id, run_after=task.run_after)
        except BaseException:
            results.discard(conn, result.id, task.queue_name)  # nothing was published: no result that never runs
            raise
        self._enqueued(result)
        return result

    def _enqueued(self, result):
        if self.config["OUTBOX"]:
            # task_enqueued once the row commits: a rolled-back enqueue is no task, and a listener must not count it.
            transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result),
                                  using=self.config["DATABASE"])
        else:
            task_enqueued.send(type(self), task_result=result)

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
