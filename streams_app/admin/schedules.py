"""The control room's Schedules page: the periodic tasks of TASKS (streams_app.tasks.periodic), read live.

One row per periodic task of every StreamsBackend: its name, task, queue, the schedule in words, the next
tick, and the last run (the newest tick enqueued, and the last "Run now"), each linked to its result on the
Tasks page with the result's status. Entries the system checks refuse (E064-E068) are not scheduled and
not listed; the page says how many.

"Run now" (permission ``run_periodicschedule``, a confirmation, POST, a LogEntry) enqueues one extra run of
the task with the entry's arguments, queue and priority, as an ordinary result with a new id; the ticks
are not moved.

There is no table: ``PeriodicSchedule`` is an unmanaged model that carries the page's permissions.
"""
import json
import time

from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from streams_app.admin.support import confirmation, log_actions, page_context
from streams_app.redis.connection import TRANSIENT_ERRORS, page_connection
from streams_app.exceptions import RejectMessage
from streams_app.models import PeriodicSchedule
from streams_app.tasks import results, setup
from streams_app.tasks.periodic import entries as periodic_entries
from streams_app.tasks.periodic import scheduler
from streams_app.tasks.periodic.schedule import to_datetime


def _configured():
    """(valid entries, how many entries the checks refuse)."""
    valid = periodic_entries.entries()
    given = sum(len(table) for _, params in setup.streams_backends()
                if isinstance(table := periodic_entries.periodic_of(params), dict))
    return valid, given - len(valid)


def _entry(alias, name):
    for entry in periodic_entries.entries():
        if entry.alias == alias and entry.name == name:
            return entry
    raise Http404(f"No periodic task {name!r} of TASKS[{alias!r}] (or the system checks refuse it)")


def _result_link(result_id):
    return reverse("admin:streams_app_taskresult_change", args=[result_id]) if results.valid_id(result_id) else ""


class SchedulesPage:
    """The views of the Schedules page, mounted by PeriodicScheduleAdmin (``admin_site.admin_view``: staff only)."""

    def __init__(self, model_admin):
        self.model_admin = model_admin

    def urls(self):
        view = self.model_admin.admin_site.admin_view
        return [
            path("", view(self.list_view), name="streams_app_periodicschedule_changelist"),
            path("<str:alias>/<str:name>/run/", view(self.run_view), name="streams_app_periodicschedule_run"),
        ]

    def _context(self, request, title, **extra):
        return page_context(self.model_admin, request, title, **extra)

    def list_view(self, request):
        if not self.model_admin.has_view_permission(request):
            raise PermissionDenied
        configured, refused = _configured()
        now_ms = int(time.time() * 1000)
        rows, unreachable = [], False
        conn = page_connection(request)
        for entry in configured:
            upcoming = entry.schedule.next_after(now_ms)
            row = {"entry": entry, "schedule": entry.schedule.describe(), "queue": periodic_entries.queue_of(entry),
                   "next": to_datetime(upcoming) if upcoming is not None else None, "problem": "",
                   "run_url": reverse("admin:streams_app_periodicschedule_run", args=[entry.alias, entry.name])}
            rows.append(row)
            if unreachable:
                continue
            try:
                state = scheduler.status(conn, entry)
            except RejectMessage as exc:
                row["problem"] = str(exc)
                continue
            except TRANSIENT_ERRORS as exc:
                self.model_admin.message_user(request, f"Redis is unreachable ({type(exc).__name__}: {exc}): the "
                                                       "last runs cannot be read now.", messages.ERROR)
                unreachable = True
                continue
            row["last"] = to_datetime(state["tick"]) if state["tick"] is not None else None
            row["last_id"], row["last_url"] = state["id"], _result_link(state["id"])
            row["manual_at"] = to_datetime(state["manual_at"]) if state["manual_at"] is not None else None
            row["manual_id"], row["manual_url"] = state["manual_id"], _result_link(state["manual_id"])
        if not unreachable:
            wanted = [row.get(name) for row in rows for name in ("last_id", "manual_id")]
            try:
                found = dict(zip(wanted, results.many(conn, [w or "" for w in wanted])))
            except TRANSIENT_ERRORS:
                found = {}
            for row in rows:
                for name in ("last", "manual"):
                    record = found.get(row.get(f"{name}_id"))
                    row[f"{name}_status"] = record["status"] if record else ""
        context = self._context(request, "Schedules", rows=rows, refused=refused, unreachable=unreachable,
                                can_run=self.model_admin.has_run_permission(request))
        return TemplateResponse(request, "admin/streams_app/periodicschedule/change_list.html", context)

    def run_view(self, request, alias, name):
        """Run now: a confirmation (the first POST), then (POST with post=yes) one enqueue and a LogEntry."""
        model_admin = self.model_admin
        if not model_admin.has_view_permission(request) or not model_admin.has_run_permission(request):
            raise PermissionDenied
        entry = _entry(alias, name)
        back = reverse("admin:streams_app_periodicschedule_changelist")
        if request.method != "POST":
            return HttpResponseRedirect(back)
        if request.POST.get("post") != "yes":
            return confirmation(
                request, model_admin, title=f"Run periodic task {name} now", action="run",
                items=[f"{entry.task_path} ({entry.schedule.describe()}), backend {alias}"],
                warning="One extra run is enqueued now, as a new result; the schedule's own ticks go on as before.",
                preview=f"args: {json.dumps(entry.args, indent=2)}\nkwargs: {json.dumps(entry.kwargs, indent=2)}",
                form_action=request.path)
        try:
            result = scheduler.run_now(entry)
        except TRANSIENT_ERRORS as exc:
            model_admin.message_user(request, f"Redis did not answer ({type(exc).__name__}: {exc}): the run may or may "
                                              "not have been enqueued. The Tasks page shows it once Redis is back.",
                                     messages.ERROR)
            return HttpResponseRedirect(back)
        except RejectMessage as exc:
            model_admin.message_user(request, f"Not run: {exc}. Nothing was enqueued.", messages.ERROR)
            return HttpResponseRedirect(back)
        log_actions(request, model_admin.model, [(f"{alias}:{name}", f"schedule {name}",
                                                  f"Ran periodic task {name} ({entry.task_path}) now: result "
                                                  f"{result.id} on queue {result.task.queue_name}")], ADDITION)
        model_admin.message_user(request, f"Enqueued {entry.task_path} now as result {result.id}.", messages.SUCCESS)
        return HttpResponseRedirect(back)


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(admin.ModelAdmin):
    """The Schedules page; nothing here is a row (``get_urls`` mounts SchedulesPage's views)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_run_permission(self, request):
        return request.user.has_perm("streams_app.run_periodicschedule")

    def get_urls(self):
        return SchedulesPage(self).urls()
