"""Django's Tasks framework on Shoal: ``TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend"}}``
(docs/tasks.md). The backend is imported lazily, so projects without django.tasks or the django-tasks
backport can import streams_app.tasks.setup."""
from importlib.util import find_spec


def api_available():
    """Whether Django's Tasks API can be imported: django.tasks (Django 6) or the django-tasks backport
    (Django 5.2, the ``tasks`` extra). Without it a project still runs Shoal; only Tasks are off."""
    return find_spec("django.tasks") is not None or find_spec("django_tasks") is not None


def __getattr__(name):
    if name == "StreamsBackend":
        from streams_app.tasks.backend import StreamsBackend

        return StreamsBackend
    if name == "enqueue_many":
        from streams_app.tasks.bulk import enqueue_many

        return enqueue_many
    if name in ("Retry", "exponential", "ShoalTask"):
        from streams_app.tasks import retries

        return getattr(retries, name)
    if name == "task":
        from streams_app.tasks.decorator import task

        return task
    if name == "cancel":
        from streams_app.tasks.cancelling import cancel

        return cancel
    if name in ("TaskCancelled", "TaskTimeout", "ReturnValueNotJSON", "EnqueueManyError"):
        from streams_app.tasks import exceptions

        return getattr(exceptions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
