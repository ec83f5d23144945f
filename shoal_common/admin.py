"""Pieces every Shoal admin page shares, in both apps: read-only mirror admins, per-action permissions
that answer 403, confirmation pages in the ``delete_selected`` mould, and audit entries.

The templates are this package's (shoal_common/templates/admin/shoal/), so "shoal_common" must be in
INSTALLED_APPS."""
import functools

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse

from shoal_common.connections import TRANSIENT_ERRORS
from shoal_common.redis_errors import may_have_run

try:  # Django 6.1: actions may also show on the change form
    from django.contrib.admin import ActionLocation
except ImportError:  # Django 5.2
    ActionLocation = None

CONFIRM_TEMPLATE = "admin/shoal/confirm_action.html"


def redis_unreachable_is_a_message(view):
    """An admin view that needs Redis answers an outage with a message and a redirect, never a 500.

    POST (an action): back to the same page, which shows the mirror's last copy. GET of a page
    under an object (``<id>/pending/``, ``<id>/replay/``): to that object's page; of another page of
    a model (``logical-pending/``): to the model's list.
    """

    @functools.wraps(view)
    def wrapper(self, request, *args, **kwargs):
        try:
            return view(self, request, *args, **kwargs)
        except TRANSIENT_ERRORS as exc:
            if request.method == "POST" and request.POST.get("post") and may_have_run(exc):
                # The action's command was sent and Redis did not answer: a frozen Redis runs it later.
                messages.error(request, f"Redis did not answer ({type(exc).__name__}: {exc}): what was asked may or "
                                        "may not have been done. The page shows what Redis holds once it is back.")
            else:
                messages.error(request, f"Redis is unreachable ({type(exc).__name__}: {exc}). Nothing was changed; "
                                        "try again when it is back.")
            if request.method == "POST":
                return HttpResponseRedirect(request.get_full_path())
            parent = request.path.rstrip("/").rsplit("/", 1)[0]
            return HttpResponseRedirect(parent + ("/change/" if parent.rsplit("/", 1)[-1].isdigit() else "/"))

    return wrapper


def refuse_forbidden_action(model_admin, request):
    """A POSTed action this user may not run is refused with 403, as every Shoal action answers.

    Django leaves an action the user lacks permission for out of the choices and renders the list
    again (200): nothing done and nothing said. Actions that do not exist are left to Django.
    """
    if request.method != "POST" or "action" not in request.POST:
        return
    try:
        name = request.POST.getlist("action")[int(request.POST.get("index", 0))]
    except (ValueError, IndexError):
        raise Http404("no such action") from None
    declared = {a if isinstance(a, str) else a.__name__ for a in model_admin.actions or ()}
    known = declared | {site_name for site_name, _ in model_admin.admin_site.actions}
    if name in known and name not in model_admin.get_actions(request):
        raise PermissionDenied


def log_actions(request, model, entries, action_flag):
    """One LogEntry per object touched: ``entries`` are (object_id, object_repr, message)."""
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    LogEntry.objects.bulk_create([
        LogEntry(user_id=request.user.pk, content_type=content_type, object_id=str(object_id),
                 object_repr=str(object_repr)[:200], action_flag=action_flag, change_message=message)
        for object_id, object_repr, message in entries
    ], batch_size=500)


def confirmation(request, model_admin, *, title, action, items, warning="", ids=(), hidden=None,
                 select_across=False, count=None, form_action="", id_field=helpers.ACTION_CHECKBOX_NAME, preview=""):
    """The page between choosing an action and doing it: it posts back ``action``, the ids and post=yes."""
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "opts": opts,
        "app_label": opts.app_label,
        "action": action,
        "items": items,
        "count": len(items) if count is None else count,
        "warning": warning,
        "ids": ids,
        "hidden": (hidden or {}).items(),
        "select_across": select_across,
        "id_field": id_field,
        "preview": preview,
        "form_action": form_action,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, [
        f"admin/{opts.app_label}/{opts.model_name}/confirm_{action}.html",
        f"admin/{opts.app_label}/confirm_action.html",
        CONFIRM_TEMPLATE,
    ], context)


class MirrorAdmin:
    """A ModelAdmin mixin for rows copied from Redis: nobody edits them, actions carry their own permission.

    ``sync(request)`` refreshes the copy when a page opens and returns what to say about its age.
    """

    change_list_template = "admin/shoal/mirror_change_list.html"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    # Django's delete_selected would delete the copies, not what is in Redis. Django 6.1 passes
    # action_location (and warns about an override without it); 5.2 has no such parameter.
    if ActionLocation is None:

        def get_actions(self, request):
            return self._without_delete_selected(super().get_actions(request))

    else:

        def get_actions(self, request, action_location=ActionLocation.CHANGE_LIST):
            return self._without_delete_selected(super().get_actions(request, action_location=action_location))

    @staticmethod
    def _without_delete_selected(actions):
        actions.pop("delete_selected", None)
        return actions

    def has_permission_for(self, request, action_name):
        func = getattr(self, action_name, None)
        needed = getattr(func, "allowed_permissions", ())
        return all(getattr(self, f"has_{p}_permission")(request) for p in needed)

    def sync(self, request):
        raise NotImplementedError

    @redis_unreachable_is_a_message
    def changelist_view(self, request, extra_context=None):
        if request.method == "POST" and "action" in request.POST:
            response = self._guard_action(request)
            if response is not None:
                return response
        mirror = self.sync(request) if request.method == "GET" else None
        return super().changelist_view(request, {**(extra_context or {}), "mirror": mirror})

    def _guard_action(self, request):
        names = request.POST.getlist("action")
        try:
            name = names[int(request.POST.get("index", 0))]
        except (ValueError, IndexError):
            raise Http404("no such action") from None
        if not self.has_view_permission(request):
            raise PermissionDenied
        if name in self._declared_actions() and not self.has_permission_for(request, name):
            raise PermissionDenied  # hidden from this user: posting it anyway is refused, not ignored
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if not all(s.isdigit() for s in selected):
            raise Http404("malformed ids")
        if request.POST.get("post") and selected and request.POST.get("select_across") in (None, "", "0", "False"):
            found = set(self.model._default_manager.filter(pk__in=selected).values_list("pk", flat=True))
            gone = len(set(map(int, selected)) - found)
            if gone:
                self.message_user(request, self.gone_message(gone), messages.WARNING)
                if not found:
                    return HttpResponseRedirect(request.get_full_path())
        return None

    def gone_message(self, count):
        return f"{count} of the selected items no longer exist (changed by someone else meanwhile); nothing was done to them."

    def _declared_actions(self):
        return {a if isinstance(a, str) else a.__name__ for a in (self.actions or ())}

    def get_object_or_404(self, request, object_id):
        if not str(object_id).isdigit():
            raise Http404("malformed id")
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"{self.model._meta.verbose_name} {object_id} does not exist (any more)")
        return obj

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self.get_object_or_404(request, object_id)
        return super().change_view(request, object_id, form_url, extra_context)

    # Django answers a missing object on these pages with a redirect to the index (or a 403 before
    # looking): a mirror row that is gone, or an id that is not one, is a 404 on every object URL.
    def history_view(self, request, object_id, extra_context=None):
        self.get_object_or_404(request, object_id)
        return super().history_view(request, object_id, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        self.get_object_or_404(request, object_id)
        return super().delete_view(request, object_id, extra_context)

    def require(self, request, permission):
        if not getattr(self, f"has_{permission}_permission")(request):
            raise PermissionDenied
