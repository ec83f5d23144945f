"""bench/tasks.py --others: the no-op task on django-tasks-db and on django-tasks-rq."""
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task(backend="db", queue_name="dbnoop")
def db_noop(n):
    return None


@task(backend="rq", queue_name="rqnoop")
def rq_noop(n):
    return None
