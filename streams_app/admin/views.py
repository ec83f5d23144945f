"""Admin views backed by Redis directly: replaying a dead letter with an edited payload (a group's
pending entries are streams_app/admin/pending.py's).

The ModelAdmins mount these through ``admin_site.admin_view``, which requires staff and marks them never_cache.
"""
import json

from django.contrib import messages
from django.contrib.admin.models import CHANGE
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from streams_app.admin import mirror
from streams_app.admin.support import confirmation, log_actions, pretty_json
from streams_app.redis.connection import web_connection
from streams_app.exceptions import PublishError, ReplayError
from streams_app.publishing.encoding import encode_payload
from shoal_common.text import to_text
from streams_app.publishing.codec import apply_types
from streams_app.deadletters.replay import JSON_NULL, SKIP_REASONS, replay


AUDIT_PAYLOAD = 2000  # characters of an edited payload kept in its LogEntry


def _text(value):
    # Entries come from any producer: bytes that are not UTF-8 are shown escaped (\\xNN), never a 500.
    return to_text(value, errors="backslashreplace")


def replay_edited(model_admin, request, object_id):
    """Replay one dead letter with a payload the operator edited: form, confirmation, replay.

    The payload is edited as the plain JSON it is stored as; its ``payload_types`` (which values are
    datetimes, Decimals, UUIDs...) are shown beside it and re-applied, so the replayed entry reaches
    the handler with the same types. The operator may edit those too.
    """
    letter = model_admin.get_object_or_404(request, object_id)
    model_admin.require(request, "replay")
    if not model_admin.has_view_permission(request, letter):
        raise PermissionDenied  # the form shows the payload and error: replaying does not grant reading
    changelist = reverse("admin:streams_app_deadletter_changelist")
    text = request.POST.get("payload") if request.method == "POST" else None
    types_text = request.POST.get("payload_types", "") if request.method == "POST" else None
    error = ""
    if text is None:
        text = pretty_json(letter.payload)
        types_text = pretty_json(letter.fields.get("payload_types", ""))
    else:
        payload, error = _edited_payload(text, types_text)
        if not error:
            if request.POST.get("post") == "yes":
                return _do_replay_edited(model_admin, request, letter, payload, changelist)
            plain = json.loads(text)
            types = json.loads(types_text) if types_text.strip() else {}
            preview = json.dumps(plain, indent=2, ensure_ascii=False, sort_keys=True)
            if types:
                preview += "\n\nwith the types (payload_types):\n" + json.dumps(types, indent=2, ensure_ascii=False, sort_keys=True)
            return confirmation(
                request, model_admin, title="Replay with an edited payload", action="replay_edited",
                items=[f"{letter.stream} {letter.entry_id} — group {letter.group}"],
                warning="It goes back to its origin stream, for its group only, with this payload:",
                hidden={"payload": json.dumps(plain, ensure_ascii=False),
                        "payload_types": json.dumps(types, ensure_ascii=False) if types else ""},
                preview=preview,
                form_action=request.path,
            )
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Replay {letter} with an edited payload",
        "subtitle": None,
        "opts": model_admin.model._meta,
        "letter": letter,
        "payload_text": text,
        "types_text": types_text,
        "error": error,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/streams_app/deadletter/replay_edit.html", context,
                            status=400 if error else 200)


def _edited_payload(text, types_text):
    """(the payload with its types applied, '') or (None, what is wrong with the operator's input)."""
    try:
        return _checked_payload(text, types_text)
    except RecursionError:
        return None, ("This is nested too deeply to be handled (deeper than Python's JSON parser goes: about 1,000 "
                      "levels on Python 3.11, more on newer ones). "
                      "Nothing was replayed.")


def _checked_payload(text, types_text):
    try:
        payload = json.loads(text)
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return None, (f"This is not valid Unicode: it holds a lone surrogate ({exc.object[exc.start]!r}), "
                      "which cannot be stored. Remove it or use a real character.")
    except ValueError as exc:
        return None, f"This is not valid JSON: {exc}"
    if types_text.strip():
        try:
            types = json.loads(types_text)
        except ValueError as exc:
            return None, f"The types are not valid JSON: {exc}"
        try:
            payload = apply_types(payload, types)
        except ValueError as exc:
            return None, f"The types do not fit the payload: {exc}. Fix or remove that line of the types."
    try:
        # Publish's own rules (NaN/Infinity, lone surrogates, MAX_PAYLOAD_BYTES), before the confirmation.
        encode_payload(payload)
    except PublishError as exc:
        return None, f"This cannot be replayed: {exc}. Nothing was replayed."
    return payload, ""


def _do_replay_edited(model_admin, request, letter, payload, changelist):
    try:
        result = replay(letter.stream, letter.group, ids=[letter.entry_id],
                        payload_override=JSON_NULL if payload is None else payload, conn=web_connection())
    except ReplayError as exc:
        model_admin.message_user(request, f"Not replayed: {exc}", messages.ERROR)
        return HttpResponseRedirect(request.path)
    letter_pk, letter_repr = letter.pk, str(letter)
    why = result.skipped.get(letter.entry_id)
    if why not in (None, "missing"):  # still in Redis (too wide for the script): it stays listed
        model_admin.message_user(request, f"Dead letter {letter.entry_id} was not replayed: {SKIP_REASONS[why]}. "
                                          "It stays in the dead letters.", messages.WARNING)
        return HttpResponseRedirect(changelist)
    letter.delete()
    if not result.replayed:
        model_admin.message_user(request, f"Dead letter {letter.entry_id} is no longer in Redis: it was replayed or "
                                          "deleted by someone else meanwhile. Nothing was replayed.", messages.WARNING)
        return HttpResponseRedirect(changelist)
    [(_, new_id)] = result.replayed
    from streams_app.models import DeadLetter

    # The audit keeps what was sent (the letter itself leaves the dead-letter stream).
    sent = json.dumps(payload, ensure_ascii=False, sort_keys=True, default=str)
    sent = sent if len(sent) <= AUDIT_PAYLOAD else sent[:AUDIT_PAYLOAD] + "…"
    log_actions(request, DeadLetter, [(letter_pk, letter_repr, f"Replayed with an edited payload to group "
                                                               f"{letter.group} of {letter.stream} as entry {new_id}; "
                                                               f"payload: {sent}")], CHANGE)
    model_admin.message_user(request, f"Replayed {letter.entry_id} with the edited payload to group {letter.group} "
                                      f"as entry {new_id}.", messages.SUCCESS)
    mirror.try_sync(web_connection())
    return HttpResponseRedirect(changelist)
