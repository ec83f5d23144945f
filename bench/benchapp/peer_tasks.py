"""bench/tasks.py --django-tasks-redis: the no-op task on django-tasks-redis (Django 6's own @task)."""
from django.tasks import task


@task(backend="dtr", queue_name="dtrnoop")
def dtr_noop(n):
    return None
