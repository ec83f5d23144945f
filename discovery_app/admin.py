"""Registered service instances (a mirror of the registry) with drain, undrain and deregister actions."""
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION
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
    list_display = ("service", "instance_id", "endpoint", "version", "zone", "weight", "heartbeat", "healthy", "rotation")
    list_filter = ("service", "zone", "healthy", "draining", "failing", "version")
    search_fields = ("service", "instance_id", "address", "version")
    fields = ("service", "instance_id", "address", "port", "version", "zone", "weight", "tags", "registered_at",
              "last_heartbeat", "ttl", "healthy", "draining", "failing", "synced_at")
    readonly_fields = fields
    actions = ("drain", "undrain", "deregister")

    def has_deregister_permission(self, request):
        return request.user.has_perm("discovery_app.deregister_instance")

    def has_drain_permission(self, request):
        return request.user.has_perm("discovery_app.drain_instance")

    @admin.display(description="rotation")
    def rotation(self, obj):
        if obj.draining:
            return "draining"
        return "failing its health check" if obj.failing else "in rotation"

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

    @admin.action(permissions=["drain"], description="Drain selected instances (take them out of rotation)")
    def drain(self, request, queryset):
        return self._set_draining(request, queryset, draining=True)

    @admin.action(permissions=["drain"], description="Put selected instances back in rotation")
    def undrain(self, request, queryset):
        return self._set_draining(request, queryset, draining=False)

    def _set_draining(self, request, queryset, *, draining):
        action = "drain" if draining else "undrain"
        if not request.POST.get("post"):
            warning = ("Clients stop picking them while another instance of the service is in rotation (if none is "
                       "left they are still used: better a drained instance than none). They stay registered and keep "
                       "their heartbeats; put them back with the other action or `manage.py discover SERVICE --undrain ID`."
                       if draining else "Clients pick them again at their next refresh (at once where pub/sub reaches them).")
            return confirmation(
                request, self, title="Drain instances" if draining else "Put instances back in rotation", action=action,
                items=[f"{i.service}: {i.instance_id} at {i.endpoint}" for i in queryset], ids=[i.pk for i in queryset],
                warning=warning,
            )
        registry = ServiceRegistry()
        done, gone = [], 0
        try:
            for instance in queryset:
                if registry.set_draining(instance.service, instance.instance_id, draining):
                    done.append(instance)
                else:
                    gone += 1
        except TRANSIENT_ERRORS as exc:
            self.message_user(request, f"Redis did not answer ({type(exc).__name__}: {exc}); "
                                       f"{len(done)} instance(s) were changed before that.", messages.ERROR)
        state = "draining" if draining else "back in rotation"
        log_actions(request, ServiceInstance, [
            (i.pk, i.instance_id, f"{i.instance_id} of {i.service} ({i.endpoint}) set {state}") for i in done
        ], CHANGE)
        ServiceInstance.objects.filter(pk__in=[i.pk for i in done]).update(draining=draining)
        if done:
            self.message_user(request, f"{len(done)} instance{'s are' if len(done) != 1 else ' is'} {state}.",
                              messages.SUCCESS)
        if gone:
            self.message_user(request, f"{gone} instance{'s were' if gone != 1 else ' was'} no longer registered "
                                       "(expired or deregistered meanwhile); nothing was done to "
                                       f"{'them' if gone != 1 else 'it'}.", messages.WARNING)
