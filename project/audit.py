"""The audit trail: a read-only admin page of the LogEntries of Shoal's objects.

Every mutating action of the control room writes LogEntries (who, when, what was done to which
entry). Django shows them only under each object's History, which is gone with the object: a
replayed or deleted dead letter's row leaves the mirror. This page lists them all, searchable and
filtered by object, kind of object, action and user; it needs ``admin.view_logentry``.
"""
from django.contrib import admin
from django.contrib.admin.models import LogEntry

from shoal_common.admin import refuse_forbidden_action

AUDITED_APPS = ("streams_app", "discovery_app")


class AuditedTypeFilter(admin.SimpleListFilter):
    title = "kind of object"
    parameter_name = "content_type"

    def lookups(self, request, model_admin):
        from django.contrib.contenttypes.models import ContentType

        return [(ct.pk, f"{ct.app_label}: {ct.name}") for ct in ContentType.objects.filter(app_label__in=AUDITED_APPS)]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(content_type_id=value) if value and str(value).isdigit() else queryset


@admin.register(LogEntry)
class AuditAdmin(admin.ModelAdmin):
    list_display = ("action_time", "user", "content_type", "object_repr", "action_flag", "change_message")
    list_filter = (AuditedTypeFilter, "action_flag", "user")
    search_fields = ("object_repr", "change_message", "object_id")
    date_hierarchy = "action_time"
    list_select_related = ("user", "content_type")
    readonly_fields = ("action_time", "user", "content_type", "object_id", "object_repr", "action_flag", "change_message")
    fields = readonly_fields

    def get_queryset(self, request):
        return super().get_queryset(request).filter(content_type__app_label__in=AUDITED_APPS)

    def lookup_allowed(self, lookup, value, request=None):
        # ?object_id=N: one object's history, also once the object itself is gone.
        return lookup == "object_id" or super().lookup_allowed(lookup, value, request)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        refuse_forbidden_action(self, request)  # delete_selected: 403, as every Shoal action the user may not run
        return super().changelist_view(request, extra_context)
