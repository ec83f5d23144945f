"""streams_app's admin helpers: the shared ones (shoal_common.admin) and entry-id checks of its own."""
import json

from django.http import Http404

from shoal_common.admin import (  # noqa: F401  (re-exported for the streams admin modules)
    CONFIRM_TEMPLATE,
    MirrorAdmin,
    confirmation,
    log_actions,
    redis_unreachable_is_a_message,
)
from streams_app.redis.entry_ids import is_entry_id

def check_entry_ids(ids):
    """Stream entry ids from a form; anything malformed is a 404, never a Redis error."""
    ids = list(dict.fromkeys(ids))
    if not ids or not all(is_entry_id(i) for i in ids):
        raise Http404("malformed or missing entry ids")
    return ids


def pretty_json(text):
    """JSON text indented for a page (keys sorted); text that is not JSON as it is."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return text


def page_context(model_admin, request, title, **extra):
    """The template context of one of the control room's own pages (not a changelist of a table)."""
    request.current_app = model_admin.admin_site.name
    return {**model_admin.admin_site.each_context(request), "title": title, "subtitle": None,
            "opts": model_admin.model._meta, **extra}
