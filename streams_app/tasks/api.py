"""Django's Tasks API, from the one place it comes from: ``django.tasks`` (Django 6.0 and later) or
the ``django-tasks`` backport (Django 5.2: ``pip install django-shoal[tasks]``). Every other module
of streams_app.tasks imports these names from here, never from either package.
"""
try:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks import signals as _signals
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the backport, under its own name
    from django_tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks import signals as _signals
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

# Django's own receivers, which only log a line ("Task id=... path=... state=..."): the runner writes that
# line itself when it does not build TaskResults (streams_app/tasks/runner.py, listened()).
DJANGO_LOG_RECEIVERS = {getattr(_signals, name, None) for name in ("log_task_started", "log_task_finished")} - {None}
tasks_logger = _signals.logger

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME", "TASK_MAX_PRIORITY", "TASK_MIN_PRIORITY", "BaseTaskBackend", "DJANGO_LOG_RECEIVERS", "InvalidTask", "Task",
    "TaskContext", "TaskError", "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json",
    "task", "task_backends", "task_enqueued", "task_finished", "task_started", "tasks_logger",
]
