"""The task counters (streams_app/metrics/tasks.py) follow Django's task signals for StreamsBackend.

Django fires ``task_enqueued`` when ``enqueue`` returns, ``task_started`` when an attempt starts and
``task_finished`` when a result is SUCCESSFUL or FAILED (a raise that will be retried fires none).
With OPTIONS["OUTBOX"] the backend sends ``task_enqueued`` when the caller's transaction commits: a
rolled-back enqueue published nothing, so it is neither signalled nor counted. Without django.tasks or the backport nothing is
connected (a project that does not use Tasks needs neither).
"""

from streams_app.metrics import tasks as counters
from streams_app.tasks import api_available

_FINISHED = {"SUCCESSFUL": counters.succeeded, "FAILED": counters.failed}


def _ours(sender):
    from streams_app.tasks.backend import StreamsBackend

    return isinstance(sender, type) and issubclass(sender, StreamsBackend)


def _labels(task_result):
    return task_result.task.module_path, task_result.task.queue_name


def on_enqueued(sender, task_result, **kwargs):
    if not _ours(sender):
        return
    counters.enqueued.labels(*_labels(task_result)).inc()


def on_started(sender, task_result, **kwargs):
    if _ours(sender):
        counters.started.labels(*_labels(task_result)).inc()


def on_finished(sender, task_result, **kwargs):
    counter = _FINISHED.get(str(task_result.status)) if _ours(sender) else None
    if counter is not None:
        counter.labels(*_labels(task_result)).inc()


def connect():
    """Connect the receivers (at app ready; idempotent: Django's dispatch_uid)."""
    if not api_available():
        return
    from streams_app.tasks.api import task_enqueued, task_finished, task_started

    task_enqueued.connect(on_enqueued, dispatch_uid="shoal-tasks-enqueued")
    task_started.connect(on_started, dispatch_uid="shoal-tasks-started")
    task_finished.connect(on_finished, dispatch_uid="shoal-tasks-finished")
