"""bench/tasks.py --others (in a venv that has django-tasks-db and django-tasks-rq, e.g. /tmp/benchvenv):
the StreamsBackend beside django-tasks-db (a SQLite file of its own) and django-tasks-rq (the bench's Redis)."""
import os

from bench.tasks_settings import *  # noqa: F401,F403
from bench.tasks_settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db", "django_rq"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["BENCH_TASKS_DB"]}}
TASKS = {
    **TASKS,
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["dbnoop"]},
    "rq": {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["rqnoop"]},
}
# django-tasks-rq reads results through the "default" queue's connection.
RQ_QUEUES = {name: {"URL": os.environ["REDIS_URL"]} for name in ("default", "rqnoop")}
