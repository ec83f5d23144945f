"""bench/tasks.py --django-tasks-redis (in a venv with Django 6 and django-tasks-redis, see bench/README.md):
the StreamsBackend beside django-tasks-redis, both on the bench's private Redis."""
import os

from bench.tasks_settings import *  # noqa: F401,F403
from bench.tasks_settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_redis"]
TASKS = {
    **TASKS,
    "dtr": {"BACKEND": "django_tasks_redis.RedisTaskBackend", "QUEUES": ["dtrnoop"],
            "OPTIONS": {"REDIS_URL": os.environ["REDIS_URL"]}},
}
# Django 6.1's command checks open the database: a SQLite file of the bench's own.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["BENCH_TASKS_DB"]}}
# Django 6 logs two INFO lines per task ("Task id=… state=…", for every backend alike); the project's
# LOGGING writes them to stderr, which costs more than a no-op task. BENCH_TASKS_LOG=info keeps them.
if os.environ.get("BENCH_TASKS_LOG", "warning") != "info":
    from bench.tasks_settings import LOGGING

    LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "django.tasks": {"level": "WARNING"}}}
