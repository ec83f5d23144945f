"""bench/tasks.py: Django Tasks on Shoal (bench.tasks_settings), the same work as the plain handlers
tasks_noop / tasks_sleep / tasks_sleep_async of consumers.py."""
import asyncio
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


@task(queue_name="bsleep")
async def sleep_1ms_async(n):
    await asyncio.sleep(0.001)
