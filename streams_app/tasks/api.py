"""Django's Tasks API, from the one place it comes from: ``django.tasks`` (Django 6.0 and later) or
the ``django-tasks`` backport (Django 5.2: ``pip install django-shoal[tasks]``). Every other module
of streams_app.tasks imports these names from here, never from either package.
"""
try:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the backport, under its own name
    from django_tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME", "TASK_MAX_PRIORITY", "TASK_MIN_PRIORITY", "BaseTaskBackend", "InvalidTask", "Task",
    "TaskContext", "TaskError", "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json",
    "task_backends", "task_enqueued", "task_finished", "task_started",
]
