"""``from streams_app.tasks import task``: Django's ``@task`` with per-task retries.

The same arguments as Django's own (``priority``, ``queue_name``, ``backend``, ``takes_context``), plus
``max_attempts``, ``backoff``, ``retry_on`` (streams_app/tasks/retries.py) and ``timeout`` (timelimits.py), and it returns a Django
``Task``. With retry arguments it makes the backend's task class itself, as Django's decorator does:
Django 6.0's ``@task`` takes no arguments of its own beyond those (6.1 and the 5.2 backport pass them
on), and a backend that is not a StreamsBackend is refused plainly.
"""
from streams_app.tasks.api import DEFAULT_TASK_QUEUE_NAME, InvalidTask, task_backends
from streams_app.tasks.api import task as django_task
from streams_app.tasks.retries import ShoalTask

DEFAULT_ALIAS = "default"


def task(function=None, *, max_attempts=None, backoff=None, retry_on=None, timeout=None, priority=0,
         queue_name=DEFAULT_TASK_QUEUE_NAME, backend=DEFAULT_ALIAS, takes_context=False):
    """``@task``, ``@task()`` or ``@task(max_attempts=5, backoff=exponential(2, 600), retry_on=(IOError,), timeout=60)``."""
    extra = {name: value for name, value in (("max_attempts", max_attempts), ("backoff", backoff),
                                             ("retry_on", retry_on), ("timeout", timeout)) if value is not None}
    common = {"priority": priority, "queue_name": queue_name, "backend": backend, "takes_context": takes_context}
    if not extra:
        return django_task(function, **common) if function else django_task(**common)
    task_class = getattr(task_backends[backend], "task_class", None)
    if not (isinstance(task_class, type) and issubclass(task_class, ShoalTask)):
        raise InvalidTask(f"{', '.join(extra)} {'needs' if len(extra) == 1 else 'need'} a StreamsBackend; "
                          f"TASKS[{backend!r}] is {type(task_backends[backend]).__name__}.")

    def wrapper(func):
        return task_class(func=func, run_after=None, **common, **extra)

    return wrapper(function) if function else wrapper
