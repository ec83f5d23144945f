"""Copying the registry's live instances into ServiceInstance rows for the admin.

Health is judged on the Redis server's clock (``ServiceRegistry.fetch``), as the client does.
"""
from datetime import datetime, UTC

from django.db import transaction
from django.utils import timezone as dj_timezone

from discovery_app.conf import setting
from discovery_app.registry import ServiceRegistry


def _when(seconds):
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


def sync_instances(registry=None, now=None):
    """Upsert every live instance, delete rows of instances gone from Redis. Returns the live count."""
    from discovery_app.models import ServiceInstance

    registry = registry or ServiceRegistry()
    now = now or dj_timezone.now()
    factor = setting("HEALTHY_FACTOR")
    found = []
    for service in registry.services():
        server_now, instances = registry.fetch(service)
        found += [(i, i.is_healthy(factor, server_now)) for i in instances]
    with transaction.atomic():
        for instance, healthy in found:
            ServiceInstance.objects.update_or_create(instance_id=instance.instance_id, defaults={
                "service": instance.service,
                "address": instance.address,
                "port": instance.port,
                "version": instance.version,
                "zone": instance.zone or "",
                "weight": instance.weight,
                "tags": list(instance.tags),
                "registered_at": _when(instance.registered_at),
                "last_heartbeat": _when(instance.last_heartbeat),
                "ttl": instance.ttl,
                "healthy": healthy,
                "draining": instance.draining,
                "failing": instance.failing,
                "synced_at": now,
            })
        ServiceInstance.objects.exclude(instance_id__in=[i.instance_id for i, _ in found]).delete()
    return len(found)
