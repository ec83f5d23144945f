"""Admin views backed by Redis directly: a group's pending entries (with claim / ack / dead-letter)
and replaying a dead letter with an edited payload.

Pending entries are read a page at a time (XPENDING with a cursor, then the payloads of that page
only), so a group with 100,000 entries pending costs the same as one with 50. The ModelAdmins
mount these through ``admin_site.admin_view``, which requires staff and marks them never_cache.
"""
import json

import redis
from django.contrib import messages
from django.contrib.admin.models import CHANGE
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from streams_app import keys

from streams_app.deadletters import store as deadletters

from streams_app.admin import mirror
from streams_app.admin.support import check_entry_ids, confirmation, log_actions
from streams_app.conf import get_settings
from streams_app.connection import TRANSIENT_ERRORS, page_connection, web_connection
from streams_app.exceptions import PublishError, ReplayError
from streams_app.models import MirrorState
from streams_app.producer import encode_payload
from shoal_common.redis_errors import is_missing
from shoal_common.text import to_text
from streams_app.codec import apply_types
from streams_app.deadletters.replay import JSON_NULL, replay

PENDING_PAGE_SIZE = 50
PAYLOAD_PREVIEW = 120
PENDING_ACTIONS = {
    # name: (permission, label, verb for messages)
    "claim": ("claim", "Claim to a consumer", "Claimed"),
    "ack": ("ack", "Acknowledge without processing", "Acknowledged"),
    "deadletter": ("deadletter", "Move to the dead letters", "Moved to the dead letters"),
}
ACK_WARNING = ("Acknowledging skips processing: the handler will never run for these entries, and they "
               "will not reach the dead letters either.")


def _text(value):
    # Entries come from any producer: bytes that are not UTF-8 are shown escaped (\\xNN), never a 500.
    return to_text(value, errors="backslashreplace")


def group_consumers(group, conn=None):
    """The group's consumers from XINFO CONSUMERS (name, pending, idle, inactive), or [] when gone."""
    conn = conn or web_connection()
    try:
        rows = conn.xinfo_consumers(group.stream.name, group.name)
    except redis.ResponseError as exc:
        if is_missing(exc):
            return []
        raise
    except TRANSIENT_ERRORS:
        return []
    return [{"name": _text(r["name"]), "pending": r["pending"], "idle": r["idle"] / 1000,
             "inactive": r["inactive"] / 1000 if r.get("inactive", -1) >= 0 else None} for r in rows]


def read_pending_page(conn, stream, group, after=None, count=PENDING_PAGE_SIZE):
    """One page of pending entries after id ``after``: (rows, next cursor or None). Two round trips."""
    rows = conn.xpending_range(stream, group, min="(" + after if after else "-", max="+", count=count + 1)
    more = len(rows) > count
    rows = rows[:count]
    pipe = conn.pipeline(transaction=False)
    for row in rows:
        entry_id = _text(row["message_id"])
        pipe.xrange(stream, min=entry_id, max=entry_id)
    entries = pipe.execute() if rows else []
    page = []
    for row, found in zip(rows, entries):
        fields = {_text(k): _text(v) for k, v in found[0][1].items()} if found else None
        payload = "(deleted from the stream)" if fields is None else fields.get("payload", fields.get("data", ""))
        page.append({
            "id": _text(row["message_id"]),
            "consumer": _text(row["consumer"]),
            "idle": row["time_since_delivered"] / 1000,
            "deliveries": row["times_delivered"],
            "payload": payload[:PAYLOAD_PREVIEW] + ("…" if len(payload) > PAYLOAD_PREVIEW else ""),
        })
    return page, (page[-1]["id"] if more and page else None)


def pending_entries(model_admin, request, object_id):
    group = model_admin.get_object_or_404(request, object_id)
    if not model_admin.has_view_permission(request, group):
        raise PermissionDenied
    allowed = {name: spec for name, spec in PENDING_ACTIONS.items()
               if getattr(model_admin, f"has_{spec[0]}_permission")(request)}
    if request.method == "POST":
        return _pending_action(model_admin, request, group, allowed)
    conn = page_connection(request)
    after = request.GET.get("after") or None
    if after is not None:
        check_entry_ids([after])
    stream = group.stream.name
    copied = None
    try:
        summary = conn.xpending(stream, group.name)
        page, next_after = read_pending_page(conn, stream, group.name, after)
    except redis.ResponseError as exc:
        if not is_missing(exc):
            raise
        summary, page, next_after = {"pending": 0}, [], None
        model_admin.message_user(request, f"Group {group} no longer exists in Redis.", messages.WARNING)
    except TRANSIENT_ERRORS as exc:
        # Asked once (ADMIN_REDIS_TIMEOUT): the page shows the mirror's count and its age instead.
        summary, page, next_after = {"pending": group.pending}, [], None
        copied = MirrorState.objects.filter(name=mirror.STREAMS_MIRROR).first()
        model_admin.message_user(request, f"Redis is unreachable ({type(exc).__name__}: {exc}): the entries cannot "
                                          "be listed or acted on now. The count is the mirror's last copy.",
                                 messages.ERROR)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Pending entries of {group}",
        "subtitle": None,
        "opts": model_admin.model._meta,
        "group": group,
        "mirror": copied,
        "total": summary.get("pending", 0),
        "entries": page,
        "after": after,
        "next_url": f"?{urlencode({'after': next_after})}" if next_after else "",
        "first_url": request.path if after else "",
        "actions": [(name, spec[1]) for name, spec in allowed.items()],
        "consumers": group_consumers(group, conn),
        "pending_timeout": get_settings()["PENDING_TIMEOUT_MS"] / 1000,
        "group_url": reverse("admin:streams_app_consumergroup_change", args=[group.pk]),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/streams_app/consumergroup/pending.html", context)


def _pending_action(model_admin, request, group, allowed):
    action = request.POST.get("action", "")
    if action not in PENDING_ACTIONS:
        raise Http404("no such action")
    if action not in allowed:
        raise PermissionDenied
    ids = check_entry_ids(request.POST.getlist("entry"))
    stream = group.stream.name
    target = request.POST.get("consumer", "")
    back = request.get_full_path()
    conn = web_connection()
    if action == "claim" and target not in {c["name"] for c in group_consumers(group, conn)}:
        model_admin.message_user(request, "Choose one of the group's consumers to claim the entries to.", messages.ERROR)
        return HttpResponseRedirect(back)
    if not request.POST.get("post"):
        warning = {
            "ack": ACK_WARNING,
            "claim": f"The entries become pending for consumer {target}; their delivery counts stay as they are.",
            "deadletter": "The entries leave the group's pending list and go to the dead-letter stream, from where "
                          "they can be replayed.",
        }[action]
        return confirmation(request, model_admin, title=f"{PENDING_ACTIONS[action][1]}: {group}", action=action,
                            items=[f"{stream} {i}" for i in ids], warning=warning,
                            hidden={"consumer": target} if target else None,
                            ids=ids, form_action=back, id_field="entry")
    done = _apply(conn, request, stream, group.name, action, ids, target)
    gone = len(ids) - len(done)
    verb = PENDING_ACTIONS[action][2]
    log_actions(request, type(group), [(group.pk, f"{group} {i}", f"{verb} pending entry {i}" +
                                        (f" to consumer {target}" if action == "claim" else ""))
                                       for i in done], CHANGE)
    if done:
        model_admin.message_user(request, f"{verb} {len(done)} pending entr{'ies' if len(done) != 1 else 'y'} of {group}.",
                                 messages.SUCCESS)
    if gone:
        model_admin.message_user(request, f"{gone} of the entries were no longer pending (handled, claimed or moved "
                                          "meanwhile); nothing was done to them.", messages.WARNING)
    mirror.try_sync(conn)
    return HttpResponseRedirect(back)


def _apply(conn, request, stream, group, action, ids, target):
    """Do ``action`` on the ids that are still pending; return those ids."""
    pipe = conn.pipeline(transaction=False)
    for entry_id in ids:
        pipe.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    still = [i for i, rows in zip(ids, pipe.execute()) if rows]
    if not still:
        return []
    if action == "ack":
        conn.xack(stream, group, *still)
        return still
    if action == "claim":
        # JUSTID: an operator moving entries is not a delivery, so the counts stay honest.
        return [_text(i) for i in conn.xclaim(stream, group, target, min_idle_time=0, message_ids=still, justid=True)]
    pipe = conn.pipeline(transaction=False)
    for entry_id in still:
        pipe.hexists(keys.error_key(stream, group, entry_id), "error")
    recorded = pipe.execute()
    note = f"moved to the dead letters by {request.user.get_username()} from the admin"
    result = deadletters.move(conn, stream, group, [(i, "" if r else note, "") for i, r in zip(still, recorded)])
    return [entry_id for entry_id, _ in result.moved]


def replay_edited(model_admin, request, object_id):
    """Replay one dead letter with a payload the operator edited: form, confirmation, replay.

    The payload is edited as the plain JSON it is stored as; its ``payload_types`` (which values are
    datetimes, Decimals, UUIDs...) are shown beside it and re-applied, so the replayed entry reaches
    the handler with the same types. The operator may edit those too.
    """
    letter = model_admin.get_object_or_404(request, object_id)
    model_admin.require(request, "replay")
    changelist = reverse("admin:streams_app_deadletter_changelist")
    text = request.POST.get("payload") if request.method == "POST" else None
    types_text = request.POST.get("payload_types", "") if request.method == "POST" else None
    error = ""
    if text is None:
        from streams_app.admin.model_admins import pretty_json

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
    letter.delete()
    if not result.replayed:
        model_admin.message_user(request, f"Dead letter {letter.entry_id} is no longer in Redis: it was replayed or "
                                          "deleted by someone else meanwhile. Nothing was replayed.", messages.WARNING)
        return HttpResponseRedirect(changelist)
    [(_, new_id)] = result.replayed
    from streams_app.models import DeadLetter

    log_actions(request, DeadLetter, [(letter_pk, letter_repr, f"Replayed with an edited payload to group "
                                                               f"{letter.group} of {letter.stream} as entry {new_id}")], CHANGE)
    model_admin.message_user(request, f"Replayed {letter.entry_id} with the edited payload to group {letter.group} "
                                      f"as entry {new_id}.", messages.SUCCESS)
    mirror.try_sync(web_connection())
    return HttpResponseRedirect(changelist)
