"""The outbox in the control room: what waits, what keeps failing and why; retry now, or delete a row for good."""
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE
from django.http import Http404
from django.utils.text import Truncator

from shoal_common.admin import confirmation, log_actions, refuse_forbidden_action
from shoal_common.text import counted
from streams_app.outbox import cleanup
from streams_app.outbox.models import OutboxMessage


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("waiting", "waiting"), ("failing", "failing (refused at least once)"), ("relayed", "relayed")]

    def queryset(self, request, queryset):
        if self.value() == "waiting":
            return queryset.filter(relayed_at__isnull=True)
        if self.value() == "failing":
            return queryset.filter(relayed_at__isnull=True, attempts__gt=0)
        if self.value() == "relayed":
            return queryset.filter(relayed_at__isnull=False)
        return queryset


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    list_display = ("id", "stream", "key", "created_at", "relayed_at", "entry_id", "attempts", "error", "next_attempt_at")
    list_filter = (StateFilter, "stream")
    search_fields = ("key", "stream", "entry_id")
    readonly_fields = ("stream", "key", "fields", "maxlen", "created_at", "relayed_at", "entry_id", "attempts",
                       "last_error", "next_attempt_at")
    fields = readonly_fields
    ordering = ("-id",)
    actions = ["retry_now"]

    # Django answers an id that is not one with a redirect to the index: every object URL here is a 404.
    def _exists_or_404(self, request, object_id):
        if not str(object_id).isdigit() or self.get_object(request, object_id) is None:
            raise Http404(f"no outbox message {object_id} (relayed rows are deleted after OUTBOX_RETENTION)")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self._exists_or_404(request, object_id)
        return super().change_view(request, object_id, form_url, extra_context)

    def history_view(self, request, object_id, extra_context=None):
        self._exists_or_404(request, object_id)
        return super().history_view(request, object_id, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        self._exists_or_404(request, object_id)
        return super().delete_view(request, object_id, extra_context)

    def has_add_permission(self, request):
        return False  # rows come from publish(..., outbox=True) in the writer's transaction, nowhere else

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="last error")
    def error(self, obj):
        return Truncator(obj.last_error).chars(120)

    def has_retry_permission(self, request):
        return request.user.has_perm("streams_app.retry_outboxmessage")

    @admin.action(description="Retry the selected waiting rows at the next relay pass", permissions=["retry"])
    def retry_now(self, request, queryset):
        waiting = list(queryset.filter(relayed_at__isnull=True).order_by("id"))
        if not request.POST.get("post"):
            return confirmation(
                request, self, title="Retry outbox rows now", action="retry_now",
                items=[f"#{row.pk} {row.stream} key={row.key or '-'}: {row.attempts} attempts"
                       + (f", last error: {Truncator(row.last_error).chars(80)}" if row.last_error else "")
                       for row in waiting],
                ids=[row.pk for row in queryset],
                warning="Their back-off is cleared: the relay sends them at its next pass (rows already relayed "
                        "are left alone).",
            )
        count = OutboxMessage.objects.filter(pk__in=[row.pk for row in waiting], relayed_at__isnull=True) \
            .update(next_attempt_at=None)
        log_actions(request, OutboxMessage, [
            (row.pk, f"outbox #{row.pk}", f"Retry now: back-off cleared after {row.attempts} attempts "
                                          f"({Truncator(row.last_error).chars(150) or 'no error'})")
            for row in waiting
        ], CHANGE)
        self.message_user(request, f"{counted(count, 'waiting row')} {'is' if count == 1 else 'are'} due at the "
                                   "relay's next pass.", messages.SUCCESS)

    def changelist_view(self, request, extra_context=None):
        refuse_forbidden_action(self, request)
        figures = cleanup.backlog()
        title = (f"Outbox: {counted(figures['rows'], 'row')} waiting, the oldest {figures['age']:.0f} s old, "
                 f"{figures['failing']} refused by Redis at least once")
        return super().changelist_view(request, {"title": title, **(extra_context or {})})
