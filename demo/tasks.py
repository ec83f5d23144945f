"""A Django Task on Shoal (docs/tasks.md): with SHOAL_DEMO=1, project/settings.py sets TASKS to a
StreamsBackend and ``runconsumer`` runs the queue ``default`` (stream ``tasks:default``)."""
import logging

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

logger = logging.getLogger("demo")


@task()
def thank_customer(customer, order_id):
    logger.info("tasks: thank-you note to customer %s for order %s", customer, order_id)
    return {"customer": customer, "order_id": order_id, "sent": True}
