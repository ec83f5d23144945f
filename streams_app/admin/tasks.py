"""The control room's Tasks page: Django Tasks run by streams_app.tasks, read live from Redis.

The list shows the newest results of each queue of each StreamsBackend in TASKS (the per-queue index
of streams_app.tasks.results, LIST_LIMIT per queue), filtered by queue and status; with a queue chosen it
pages through all of that queue's results. The counts by status are of every result stored
(results.status_counts, within COUNT_BUDGET). A result id finds one result whatever its queue. A result's page shows its arguments, return value, every error with
its traceback, its attempts and worker ids, and its times.

"Cancel" (a READY result, permission ``cancel_taskresult``, a confirmation, POST, a LogEntry): the task
will never run (streams_app/tasks/cancelling.py).

"Retry" (a FAILED result, permission ``retry_taskresult``, a confirmation, POST, a LogEntry)
enqueues the task again with the same arguments, queue and priority as a **new result** with a new
id: the failed result stays as it was, so its errors and attempts remain the record of what
happened, and the new one starts at attempt 1. (The failed task's message stays in the queue's
dead letters, where it may be deleted.)

There is no table: ``TaskResult`` is an unmanaged model that carries the page's permissions. Redis is
asked once per page (``page_connection``, ADMIN_REDIS_TIMEOUT): when it does not answer, the page says
so instead of listing anything.
"""
import json

from asgiref.sync import iscoroutinefunction
from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, CHANGE
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from streams_app.admin.support import confirmation, log_actions, page_context
from streams_app.redis.connection import TRANSIENT_ERRORS, page_connection
from streams_app.exceptions import RejectMessage
from streams_app.models import TaskResult
from streams_app.tasks import messages as task_messages
from streams_app.tasks import results, setup
from streams_app.tasks.lookup import find_task

LIST_LIMIT = 200  # results per page (with no queue chosen: the newest of each queue)
PAGE_SCAN = 20 * LIST_LIMIT  # results one page reads at most while looking for those of a status
COUNT_BUDGET = 2.0  # seconds the exact counts by status may take per page; past it they say how far they got
STATUSES = ("READY", "RUNNING", "SUCCESSFUL", "FAILED")


def configured_queues():
    """Every queue of every StreamsBackend in TASKS, in the order TASKS names them, once each."""
    return list(dict.fromkeys(queue for _, params in setup.streams_backends() for queue in setup.queues(params)))


def _pretty(value):
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _unreachable(model_admin, request, exc):
    model_admin.message_user(request, f"Redis is unreachable ({type(exc).__name__}: {exc}): task results cannot be "
                                      "read or retried now. Try again when it is back.", messages.ERROR)


def _stream(record):
    """The stream the task's messages go to (its ``async def`` ones have their own), '' when unknown."""
    try:
        is_async = iscoroutinefunction(find_task(record["task"]).func)
    except RejectMessage:
        return ""  # the code changed since: the page still shows the result
    return task_messages.stream_for(record["queue"], record["priority"], is_async) if record["queue"] else ""


class TasksPage:
    """The views of the Tasks page, mounted by TaskResultAdmin (``admin_site.admin_view``: staff only)."""

    def __init__(self, model_admin):
        self.model_admin = model_admin

    def urls(self):
        view = self.model_admin.admin_site.admin_view
        return [
            path("", view(self.list_view), name="streams_app_taskresult_changelist"),
            path("<str:result_id>/", view(self.detail_view), name="streams_app_taskresult_change"),
            path("<str:result_id>/retry/", view(self.retry_view), name="streams_app_taskresult_retry"),
            path("<str:result_id>/cancel/", view(self.cancel_view), name="streams_app_taskresult_cancel"),
        ]

    def _context(self, request, title, **extra):
        return page_context(self.model_admin, request, title, **extra)

    def _require_view(self, request):
        if not self.model_admin.has_view_permission(request):
            raise PermissionDenied

    def list_view(self, request):
        self._require_view(request)
        wanted_id = request.GET.get("id", "").strip()
        if wanted_id:
            return self._find(request, wanted_id)
        queues = configured_queues()
        queue = request.GET.get("queue", "")
        status = request.GET.get("status", "")
        problems = []
        if queue and queue not in queues:
            problems.append(f"No queue {queue!r} in TASKS (queues: {', '.join(queues) or 'none'}); showing every queue.")
            queue = ""
        if status and status not in STATUSES:
            problems.append(f"No status {status!r} (one of {', '.join(STATUSES)}); showing every status.")
            status = ""
        start = request.GET.get("start", "0")
        if not start.isdigit() or not queue:
            if start != "0":
                problems.append(f"'start' pages through one queue's results: a whole number with a queue chosen, not "
                                f"{start[:30]!r}; showing the newest.")
            start = "0"
        start = int(start)
        rows, counts, unreachable, next_start, partial = [], {}, False, None, []
        conn = page_connection(request)
        try:
            for name in [queue] if queue else queues:
                counts[name], counted, total = results.status_counts(conn, name, STATUSES, budget=COUNT_BUDGET)
                if counted < total:
                    partial.append((name, counted, total))
            if queue:
                rows, next_start = self._page(conn, queue, status, start)
            else:
                for name in queues:
                    found = [r for r in results.many(conn, results.ids(conn, name, LIST_LIMIT)) if r is not None]
                    rows += [r for r in found if not status or r["status"] == status]
        except TRANSIENT_ERRORS as exc:
            _unreachable(self.model_admin, request, exc)
            rows, counts, unreachable, next_start, partial = [], {}, True, None, []
        for problem in problems:
            self.model_admin.message_user(request, problem, messages.WARNING)
        rows.sort(key=lambda r: r["enqueued_at"] or r["started_at"] or r["last_attempted_at"] or 0, reverse=True)
        context = self._context(
            request, "Tasks", queues=queues, queue=queue, status=status, statuses=STATUSES, rows=rows,
            counts=[(name, counts[name]) for name in queues if name in counts], unreachable=unreachable,
            limit=LIST_LIMIT, start=start, next_start=next_start, partial=partial, count_budget=COUNT_BUDGET,
            selectors={name: f"{task_messages.selector(name)}, "
                                                f"{task_messages.async_stream_name(name)}:{task_messages.GROUP}"
                                          for name in queues})
        return TemplateResponse(request, "admin/streams_app/taskresult/change_list.html", context)

    def _page(self, conn, queue, status, start):
        """One page of ``queue``'s results from rank ``start`` of its index (newest first): LIST_LIMIT rows
        of ``status`` (any when empty), reading on past expired and other results; and the rank the next
        page starts at, or None at the index's end. At most PAGE_SCAN results are read for one page."""
        rows, rank, scanned = [], start, 0
        while len(rows) < LIST_LIMIT and scanned < PAGE_SCAN:
            ids = results.ids(conn, queue, LIST_LIMIT, start=rank)
            if not ids:
                return rows, None
            for record in results.many(conn, ids):
                rank += 1
                scanned += 1
                if record is not None and (not status or record["status"] == status):
                    rows.append(record)
                    if len(rows) == LIST_LIMIT:
                        break
        more = bool(results.ids(conn, queue, 1, start=rank))
        return rows, rank if more else None

    def _find(self, request, wanted_id):
        if not results.valid_id(wanted_id):
            self.model_admin.message_user(request, f"{wanted_id[:100]!r} is not a task result id (letters and digits, "
                                                   "at most 64).", messages.ERROR)
            return HttpResponseRedirect(request.path)
        return HttpResponseRedirect(reverse("admin:streams_app_taskresult_change", args=[wanted_id]))

    def _record(self, request, result_id):
        """The result (None when Redis does not answer: said on the page); 404 for an id that is none."""
        if not results.valid_id(result_id):
            raise Http404("not a task result id")
        try:
            record = results.get(page_connection(request), result_id)
        except TRANSIENT_ERRORS as exc:
            _unreachable(self.model_admin, request, exc)
            return None
        if record is None:
            raise Http404(f"No task result {result_id}: never enqueued, or expired (results are kept "
                          "OPTIONS['RESULT_TTL'] seconds)")
        return record

    def detail_view(self, request, result_id):
        self._require_view(request)
        record = self._record(request, result_id)
        context = self._context(request, f"Task result {result_id}", result_id=result_id, record=record)
        if record is not None:
            attempts = len(record["worker_ids"])
            context.update(
                args=_pretty(record["args"]), kwargs=_pretty(record["kwargs"]),
                return_value=_pretty(record["return_value"]) if record["status"] == "SUCCESSFUL" else None,
                attempts=attempts, workers=list(enumerate(record["worker_ids"], 1)),
                errors=list(enumerate(record["errors"], 1)),
                can_retry=(record["status"] == "FAILED" and not record["retried_as"]
                           and self.model_admin.has_retry_permission(request)),
                can_cancel=(record["status"] == "READY" and self.model_admin.has_cancel_permission(request)),
                retried_url=reverse("admin:streams_app_taskresult_change", args=[record["retried_as"]])
                if results.valid_id(record["retried_as"]) else "",
                stream=_stream(record),
            )
        return TemplateResponse(request, "admin/streams_app/taskresult/change_form.html", context)

    def _action(self, request, result_id, allowed):
        """What Retry and Cancel begin with: the view permission (the confirmation shows the arguments)
        and the action's own, a result id, a POST. Returns (detail URL, record), or (None, the response to
        give instead): a GET goes back to the result's page, which has the button; when Redis did not
        answer (said once), the result's page as it stands, not a redirect to it that would ask again and
        say it twice. Nothing changed, so a POST may answer with a page."""
        self._require_view(request)
        if not allowed(request):
            raise PermissionDenied
        if not results.valid_id(result_id):
            raise Http404("not a task result id")
        detail = reverse("admin:streams_app_taskresult_change", args=[result_id])
        if request.method != "POST":
            return None, HttpResponseRedirect(detail)
        record = self._record(request, result_id)
        if record is None:
            return None, TemplateResponse(request, "admin/streams_app/taskresult/change_form.html",
                                          self._context(request, f"Task result {result_id}", result_id=result_id,
                                                        record=None))
        return detail, record

    def retry_view(self, request, result_id):
        model_admin = self.model_admin
        detail, record = self._action(request, result_id, model_admin.has_retry_permission)
        if detail is None:
            return record
        if record["status"] != "FAILED":
            model_admin.message_user(request, f"Task result {result_id} is {record['status']}, not FAILED: only a "
                                              "failed task is retried. Nothing was enqueued.", messages.WARNING)
            return HttpResponseRedirect(detail)
        if record["retried_as"]:
            return self._already_retried(request, result_id, record["retried_as"])
        try:
            task = find_task(record["task"]).using(queue_name=record["queue"] or None,
                                                   priority=record["priority"])
        except RejectMessage as exc:
            model_admin.message_user(request, f"Not retried: {exc}. Nothing was enqueued.", messages.ERROR)
            return HttpResponseRedirect(detail)
        if request.POST.get("post") != "yes":
            return confirmation(
                request, model_admin, title=f"Retry task {record['task']}", action="retry",
                items=[f"{record['task']} (result {result_id}) on queue {record['queue']}, priority {record['priority']}"],
                warning="The task is enqueued again with the same arguments, as a new result with a new id; this "
                        "failed result stays as it is. A task that is not idempotent runs its effects again.",
                preview=f"args: {_pretty(record['args'])}\nkwargs: {_pretty(record['kwargs'])}",
                form_action=request.path)
        conn = page_connection(request)
        try:
            # One retry per failed result: a resubmitted confirmation (double click, browser resend)
            # finds it claimed and enqueues nothing.
            held = results.claim_retry(conn, result_id)
        except TRANSIENT_ERRORS as exc:
            model_admin.message_user(request, f"Redis did not answer ({type(exc).__name__}: {exc}): nothing was "
                                              "enqueued. Try again when it is back.", messages.ERROR)
            return HttpResponseRedirect(detail)
        if held is None:
            raise Http404(f"No task result {result_id}: it expired (results are kept OPTIONS['RESULT_TTL'] seconds)")
        if held:
            return self._already_retried(request, result_id, held)
        try:
            new = task.enqueue(*record["args"], **record["kwargs"])
        except TRANSIENT_ERRORS as exc:
            # The claim stays: the retry may have been enqueued, and a second one must not be.
            model_admin.message_user(request, f"Redis did not answer ({type(exc).__name__}: {exc}): the retry may or "
                                              "may not have been enqueued. The Tasks page shows it once Redis is back.",
                                     messages.ERROR)
            return HttpResponseRedirect(detail)
        except BaseException:
            results.unclaim_retry(conn, result_id)  # not enqueued: the retry can be asked again
            raise
        try:
            results.retried(conn, result_id, new.id)
        except TRANSIENT_ERRORS:
            pass  # enqueued all the same; the claim keeps a second retry out
        log_actions(request, model_admin.model, [(result_id, f"task result {result_id}",
                                                  f"Retried failed task {record['task']} (result {result_id}) as new "
                                                  f"result {new.id} on queue {record['queue']}")], ADDITION)
        model_admin.message_user(request, f"Retried {record['task']}: enqueued as new result {new.id}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:streams_app_taskresult_change", args=[new.id]))


    def cancel_view(self, request, result_id):
        """Cancel a READY task (streams_app.tasks.cancel): a confirmation, then POST; a LogEntry."""
        model_admin = self.model_admin
        detail, record = self._action(request, result_id, model_admin.has_cancel_permission)
        if detail is None:
            return record
        if record["status"] != "READY":
            model_admin.message_user(request, f"Task result {result_id} is {record['status']}: only a task that has "
                                              "not started (READY) can be cancelled. Nothing changed.", messages.WARNING)
            return HttpResponseRedirect(detail)
        if request.POST.get("post") != "yes":
            return confirmation(
                request, model_admin, title=f"Cancel task {record['task']}", action="cancel",
                items=[f"{record['task']} (result {result_id}) on queue {record['queue']}"],
                warning="The task will never run: its result becomes FAILED with a TaskCancelled error, and a worker "
                        "that reads its message acknowledges it unrun. This cannot be undone (Retry on the failed "
                        "result enqueues it again as a new result).",
                preview=f"args: {_pretty(record['args'])}\nkwargs: {_pretty(record['kwargs'])}",
                form_action=request.path)
        from streams_app.tasks.cancelling import cancel

        try:
            done = cancel(result_id)
        except TRANSIENT_ERRORS as exc:
            model_admin.message_user(request, f"Redis did not answer ({type(exc).__name__}: {exc}): the task may or may "
                                              "not be cancelled. Its page says which once Redis is back.", messages.ERROR)
            return HttpResponseRedirect(detail)
        if not done:
            model_admin.message_user(request, f"Task result {result_id} started or finished meanwhile: not cancelled.",
                                     messages.WARNING)
            return HttpResponseRedirect(detail)
        log_actions(request, model_admin.model, [(result_id, f"task result {result_id}",
                                                  f"Cancelled task {record['task']} (result {result_id}) on queue "
                                                  f"{record['queue']} before it started")], CHANGE)
        model_admin.message_user(request, f"Cancelled {record['task']} (result {result_id}): it will not run.",
                                 messages.SUCCESS)
        return HttpResponseRedirect(detail)

    def _already_retried(self, request, result_id, held):
        where = ("a retry of it is being enqueued" if held == results.RETRY_UNDER_WAY
                 else f"it was already retried as new result {held}")
        self.model_admin.message_user(request, f"Task result {result_id} is retried once from here: {where}. "
                                               "Nothing new was enqueued.", messages.WARNING)
        target = held if results.valid_id(held) else result_id
        return HttpResponseRedirect(reverse("admin:streams_app_taskresult_change", args=[target]))


@admin.register(TaskResult)
class TaskResultAdmin(admin.ModelAdmin):
    """The Tasks page; nothing here is a row (``get_urls`` mounts TasksPage's views instead of Django's)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_retry_permission(self, request):
        return request.user.has_perm("streams_app.retry_taskresult")

    def has_cancel_permission(self, request):
        return request.user.has_perm("streams_app.cancel_taskresult")

    def get_urls(self):
        return TasksPage(self).urls()
