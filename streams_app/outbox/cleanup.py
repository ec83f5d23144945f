"""Relayed rows deleted in bounded batches; the outbox backlog as figures (gauges, admin)."""
from datetime import timedelta

from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client import Gauge

MAX_BATCHES = 10  # per pass: a huge backlog of relayed rows is deleted over several passes, never in one long lock

backlog_rows = Gauge("shoal_outbox_rows", "Outbox rows not yet relayed to Redis.", ("database",),
                     multiprocess_mode="mostrecent")
backlog_age = Gauge("shoal_outbox_oldest_seconds", "Age of the oldest outbox row not yet relayed (0 when none).",
                    ("database",), multiprocess_mode="mostrecent")
failing_rows = Gauge("shoal_outbox_failing_rows", "Outbox rows Redis refused at least once and not yet relayed.",
                     ("database",), multiprocess_mode="mostrecent")


def delete_relayed(using, retention, batch):
    """Delete rows relayed more than ``retention`` seconds ago, ``batch`` at a time; return how many."""
    from streams_app.outbox.models import OutboxMessage

    manager = OutboxMessage.objects.using(using)
    cutoff = timezone.now() - timedelta(seconds=retention)
    deleted = 0
    for _ in range(MAX_BATCHES):
        ids = list(manager.filter(relayed_at__lt=cutoff).order_by("relayed_at").values_list("id", flat=True)[:batch])
        if not ids:
            break
        deleted += manager.filter(id__in=ids).delete()[0]
        if len(ids) < batch:
            break
    return deleted


def backlog(using="default"):
    """{"rows", "oldest" (datetime or None), "age" (seconds), "failing"} of the rows not yet relayed."""
    from streams_app.outbox.models import OutboxMessage

    figures = OutboxMessage.objects.using(using).filter(relayed_at__isnull=True).aggregate(
        rows=Count("id"), oldest=Min("created_at"), failing=Count("id", filter=Q(attempts__gt=0)))
    oldest = figures["oldest"]
    figures["age"] = max(0.0, (timezone.now() - oldest).total_seconds()) if oldest else 0.0
    return figures


def update_gauges(using):
    figures = backlog(using)
    backlog_rows.labels(using).set(figures["rows"])
    backlog_age.labels(using).set(figures["age"])
    failing_rows.labels(using).set(figures["failing"])
    return figures
