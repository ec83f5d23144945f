"""A mirror of the registry's live instances for the admin (discovery_app/sync.py keeps it current).

Redis stays the source of truth; a row is a copy taken at ``synced_at``.
"""
from django.db import models


class ServiceInstance(models.Model):
    service = models.CharField(max_length=200, db_index=True)
    instance_id = models.CharField(max_length=300, unique=True)
    address = models.CharField(max_length=255)
    port = models.IntegerField()
    version = models.CharField(max_length=100, blank=True)
    zone = models.CharField(max_length=100, blank=True)
    weight = models.FloatField(default=1.0)
    tags = models.JSONField(default=list)
    registered_at = models.DateTimeField(null=True)
    last_heartbeat = models.DateTimeField(null=True)
    ttl = models.FloatField(default=0.0)
    healthy = models.BooleanField(default=True, help_text="Heartbeat younger than HEALTHY_FACTOR x TTL when synced.")
    draining = models.BooleanField(default=False, help_text="Taken out of rotation by an operator: clients pick it "
                                                            "only when no other instance is left.")
    failing = models.BooleanField(default=False, help_text="Failing its registrar's active health check.")
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["service", "instance_id"]
        default_permissions = ("view",)
        permissions = [("deregister_instance", "Can deregister service instances"),
                       ("drain_instance", "Can take service instances out of rotation and back")]

    def __str__(self):
        return self.instance_id

    @property
    def endpoint(self):
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"
