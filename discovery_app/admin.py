"""Registered service instances (a mirror of the registry) with a deregister action."""
from django.contrib import admin, messages
from django.contrib.admin.models import DELETION
from django.utils import timezone

from discovery_app.models import ServiceInstance
from discovery_app.registry import ServiceRegistry
from discovery_app.sync import sync_instances
from discovery_app.connection import TRANSIENT_ERRORS
from shoal_common.admin import MirrorAdmin, confirmation, log_actions


class InstanceMirror:
    """What the page says about the age of its rows (the shape of streams_app's MirrorState)."""

    def __init__(self, synced_at, error=""):
        self.synced_at, self.error = synced_at, error


@admin.register(ServiceInstance)
class ServiceInstanceAdmin(MirrorAdmin, admin.ModelAdmin):
    list_display = ("service", "instance_id", "endpoint", "version", "zone", "weight", "heartbeat", "healthy")
    list_filter = ("service", "zone", "healthy", "version")
    search_fields = ("service", "instance_id", "address", "version")
    fields = ("service", "instance_id", "address", "port", "version", "zone", "weight", "tags", "registered_at",
              "last_heartbeat", "ttl", "healthy", "synced_at")
    readonly_fields = fields
    actions = ("deregister",)

    def has_deregister_permission(self, request):
        return request.user.has_perm("discovery_app.deregister_instance")

    @admin.display(description="last heartbeat", ordering="last_heartbeat")
    def heartbeat(self, obj):
        if obj.last_heartbeat is None:
            return "-"
        return f"{max(0.0, (obj.synced_at - obj.last_heartbeat).total_seconds()):.1f} s before the sync"

    @admin.display(description="address:port")
    def endpoint(self, obj):
        return obj.endpoint

    def sync(self, request):
        try:
            sync_instances()
        except TRANSIENT_ERRORS as exc:
            latest = ServiceInstance.objects.order_by("-synced_at").values_list("synced_at", flat=True).first()
            return InstanceMirror(latest, f"{type(exc).__name__}: {exc}")
        return InstanceMirror(timezone.now())

    def gone_message(self, count):
        return f"{count} of the selected instances are gone (expired or deregistered meanwhile); nothing was done to them."

    @admin.action(permissions=["deregister"], description="Deregister selected instances")
    def deregister(self, request, queryset):
        if not request.POST.get("post"):
            return confirmation(
                request, self, title="Deregister instances", action="deregister",
                items=[f"{i.service}: {i.instance_id} at {i.endpoint}" for i in queryset], ids=[i.pk for i in queryset],
                warning="Clients stop sending to them at once; a running instance's next heartbeat does not bring it "
                        "back (its id is tombstoned). Restart the process to register it again.",
            )
        registry = ServiceRegistry()
        removed, gone = [], 0
        for instance in queryset:
            if registry.deregister(instance.instance_id, service=instance.service):
                removed.append(instance)
            else:
                gone += 1
        log_actions(request, ServiceInstance, [
            (i.pk, i.instance_id, f"Deregistered {i.instance_id} of {i.service} ({i.endpoint})") for i in removed
        ], DELETION)
        queryset.delete()
        if removed:
            self.message_user(request, f"Deregistered {len(removed)} instance{'s' if len(removed) != 1 else ''}.",
                              messages.SUCCESS)
        if gone:
            self.message_user(request, f"{gone} instance{'s were' if gone != 1 else ' was'} no longer registered "
                                       "(expired or deregistered meanwhile).", messages.WARNING)
