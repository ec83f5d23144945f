"""bench/tasks.py: Django Tasks on Shoal (bench.tasks_settings), the same work as the plain handlers
tasks_noop / tasks_sleep of consumers.py."""
import time

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task(queue_name="bnoop")
def noop(n):
    return None


@task(queue_name="bsleep")
def sleep_1ms(n):
    time.sleep(0.001)
