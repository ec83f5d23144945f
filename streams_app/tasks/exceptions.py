"""The exceptions of streams_app.tasks."""
from streams_app.exceptions import StreamsError


class EnqueueManyError(StreamsError):
    """enqueue_many could write only some of its batches: ``enqueued`` holds the TaskResults of the tasks
    that were enqueued (all earlier batches, whole); none of the failed batch and after it was."""

    def __init__(self, message, enqueued):
        super().__init__(message)
        self.enqueued = enqueued


class ReturnValueNotJSON(TypeError):
    """A task returned a value its result cannot hold (not JSON, or NaN/Infinity): the attempt is FAILED at
    once, never retried, since running it again would return the same."""


class TaskCancelled(Exception):
    """The error of a result that ``streams_app.tasks.cancel`` cancelled before it started: its task never ran."""


class TaskTimeout(TimeoutError):
    """The error of an attempt that ran past its ``timeout`` (``@task(timeout=)``, OPTIONS["TIMEOUT"]): FAILED,
    or retried when the task's ``retry_on`` covers it (the default, every Exception, does). A sync task's
    worker process is replaced to stop it (docs/tasks.md, "Time limits"); an async task is cancelled."""
