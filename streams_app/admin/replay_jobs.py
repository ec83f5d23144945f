"""Replaying all of a group's dead letters from the admin: queued as a ReplayJob, run by the reclaim
daemon (streams_app/deadletters/jobs.py), its progress shown on the job's page."""
from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from streams_app.admin.support import MirrorAdmin, confirmation, log_actions
from streams_app.deadletters import jobs
from streams_app.models import ReplayJob


def replay_all(model_admin, request, group):
    """GET/first POST: the confirmation; POST post=yes: queue the job, log it, show its page."""
    if not request.user.has_perm("streams_app.replay_deadletter"):
        from django.core.exceptions import PermissionDenied

        raise PermissionDenied
    stream = group.stream.name
    # One job per group at a time: a second one (a double submit, two operators) would replay again the
    # letters that failed again since the first replay, running every failing message twice over.
    pending = ReplayJob.objects.filter(stream=stream, group=group.name,
                                       state__in=(ReplayJob.QUEUED, ReplayJob.RUNNING)).order_by("created_at").first()
    if pending is not None:
        model_admin.message_user(request, f"A replay of the dead letters of {group} is already {pending.state} "
                                          f"(job {pending.pk}); nothing new was queued.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:streams_app_replayjob_change", args=[pending.pk]))
    if request.POST.get("post") != "yes":
        return confirmation(
            request, model_admin, title=f"Replay every dead letter of {group}", action="replay_all",
            items=[f"{stream}: the dead letters of group {group.name} in Redis (about {group.dead_letters} copied so far)"],
            count=group.dead_letters,
            warning="Each goes back to its origin stream, for this group only. The replay runs in the background: "
                    "the reclaim daemon (manage.py runreclaimer) picks it up within a pass and reads every letter from "
                    "Redis, however many there are; its page shows the progress.",
            form_action=request.path)
    job = jobs.queue(stream, group.name, requested_by=request.user.get_username())
    log_actions(request, type(group), [(group.pk, str(group), f"Queued the replay of every dead letter of group "
                                                              f"{group.name} of {stream} (replay job {job.pk})")], ADDITION)
    model_admin.message_user(request, f"Queued: the reclaim daemon replays the dead letters of {group} (job {job.pk}).",
                             messages.SUCCESS)
    return HttpResponseRedirect(reverse("admin:streams_app_replayjob_change", args=[job.pk]))


@admin.register(ReplayJob)
class ReplayJobAdmin(MirrorAdmin, admin.ModelAdmin):
    change_list_template = None  # not a mirror of Redis: no copy age to show
    list_display = ("pk", "stream", "group", "state", "progress", "replayed", "skipped", "requested_by", "created_at",
                    "finished_at")
    list_filter = ("state", "stream")
    fields = ("stream", "group", "state", "progress", "replayed", "skipped", "error", "requested_by", "created_at",
              "started_at", "heartbeat_at", "finished_at")
    readonly_fields = fields

    def sync(self, request):
        return None

    def has_view_permission(self, request, obj=None):
        # Whoever may queue a replay sees how it goes.
        return super().has_view_permission(request, obj) or request.user.has_perm("streams_app.replay_deadletter")

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    @admin.display(description="progress")
    def progress(self, obj):
        if obj.state == ReplayJob.QUEUED and not obj.scanned:
            return "waiting for the reclaim daemon"
        if not obj.total:
            return "-" if obj.state != ReplayJob.DONE else "nothing to replay"
        percent = min(100, 100 * obj.scanned // obj.total)
        return format_html("{} of {} dead letters looked at ({}%)", obj.scanned, obj.total, percent)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        job = self.get_object_or_404(request, object_id)
        # A running job's page refreshes itself (no JavaScript): the progress moves on its own.
        extra = {"refresh": job.state in (ReplayJob.QUEUED, ReplayJob.RUNNING)}
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})
