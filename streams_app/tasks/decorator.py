"""``from streams_app.tasks import task``: Django's ``@task`` with per-task retries.

The same arguments as Django's own (``priority``, ``queue_name``, ``backend``, ``takes_context``), plus
``max_attempts``, ``backoff`` and ``retry_on`` (streams_app/tasks/retries.py), and it returns a Django
``Task``. Django's decorator already passes them on to StreamsBackend's task class; this one says so in
its signature, and refuses them plainly for a backend that is not a StreamsBackend.
"""
from streams_app.tasks.api import InvalidTask, task_backends
from streams_app.tasks.api import task as django_task
from streams_app.tasks.retries import ShoalTask

DEFAULT_ALIAS = "default"


def task(function=None, *, max_attempts=None, backoff=None, retry_on=None, backend=DEFAULT_ALIAS, **kwargs):
    """``@task``, ``@task()`` or ``@task(max_attempts=5, backoff=exponential(2, 600), retry_on=(IOError,))``."""
    extra = {name: value for name, value in (("max_attempts", max_attempts), ("backoff", backoff),
                                             ("retry_on", retry_on)) if value is not None}
    if extra and not issubclass(getattr(task_backends[backend], "task_class", object), ShoalTask):
        raise InvalidTask(f"{', '.join(extra)} {'needs' if len(extra) == 1 else 'need'} a StreamsBackend; TASKS[{backend!r}] is "
                          f"{type(task_backends[backend]).__name__}.")
    return django_task(function, backend=backend, **kwargs, **extra) if function else django_task(
        backend=backend, **kwargs, **extra)
