"""Find a message: where one entry is, for every group of its stream, from what Redis already holds.

No per-message tracking is written. For each group, in this order:

- *pending*: in the group's PEL (owner, idle, deliveries, the last error recorded for it);
- *dead-lettered*: a letter in ``{stream}:dlq`` whose origin is this entry and whose group is this one;
- *replayed*: an entry of the stream carrying ``shoal:replay_of`` = this entry for this group (its new
  id, and that entry's own state);
- *handled*: delivered (at or below the group's last-delivered id) and no longer pending;
- *not yet delivered*: past the group's last-delivered id;
- *not published*: past the stream's last entry id (no such entry yet), in every group.

Dead letters and replays are found by reading forward from the entry's time (letters and replays
come after it), at most SCAN_LIMIT entries each; a lookup by message key reads the newest SCAN_LIMIT
entries of the stream. The page says when a limit was reached.
"""
from dataclasses import dataclass, field

import redis
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from shoal_common.redis_errors import is_missing, is_wrongtype
from shoal_common.text import to_text
from streams_app.redis import keys
from streams_app.redis.connection import TRANSIENT_ERRORS, page_connection
from streams_app.deadletters.store import REPLAY_OF, TARGET_GROUP, failed_by, parse_dead_letter
from streams_app.redis.entry_ids import id_key, is_entry_id
from streams_app.redis.lag import name_bytes, to_shown

SCAN_LIMIT = 10_000
SCAN_BATCH = 1000
MAX_MATCHES = 20


def _text(value):
    return to_text(value, errors="backslashreplace")


@dataclass
class Place:
    group: str
    state: str  # pending, dead-lettered, replayed, handled, not yet delivered, not for this group
    detail: str = ""
    url: str = ""


@dataclass
class Found:
    entry_id: str
    fields: dict | None  # None: not in the stream (``absence`` says more)
    places: list = field(default_factory=list)
    problem: str = ""  # what could not be looked at (a dead-letter key of another type)
    absence: str = ""  # why the entry is not in the stream, when it is not

    @property
    def payload(self):
        return (self.fields or {}).get("payload", (self.fields or {}).get("data", ""))


def _scan_forward(conn, key, start, wanted, limit=SCAN_LIMIT):
    """Entries of ``key`` from ``start`` on for which ``wanted(fields)`` holds; (matches, reached the limit)."""
    found, seen, cursor = [], 0, start
    while seen < limit:
        page = conn.xrange(key, min=cursor, max="+", count=SCAN_BATCH)
        seen += len(page)
        found += [(_text(i), f) for i, f in page if wanted(f)]
        if len(page) < SCAN_BATCH:
            return found, False
        cursor = "(" + _text(page[-1][0])
    return found, True


def _raw_field(fields, name):
    return fields.get(name, fields.get(name.encode()) if isinstance(name, str) else None)


def _field(fields, name):
    value = fields.get(name, fields.get(name.encode()) if isinstance(name, str) else None)
    return _text(value) if value is not None else None


def by_key(conn, stream, key):
    """Ids of the newest entries (at most MAX_MATCHES) whose ``key`` field is ``key``; (ids, reached the limit)."""
    ids, seen, cursor = [], 0, "+"
    while seen < SCAN_LIMIT and len(ids) < MAX_MATCHES:
        page = conn.xrevrange(stream, max=cursor, min="-", count=SCAN_BATCH)
        seen += len(page)
        ids += [_text(i) for i, f in page if _field(f, "key") == key]
        if len(page) < SCAN_BATCH:
            return ids[:MAX_MATCHES], False
        cursor = "(" + _text(page[-1][0])
    return ids[:MAX_MATCHES], seen >= SCAN_LIMIT


def locate(conn, stream, entry_id):
    """A Found with a Place per group of ``stream``, and whether a scan stopped at its limit."""
    entry = conn.xrange(stream, min=entry_id, max=entry_id)
    fields = {_text(k): _text(v) for k, v in entry[0][1].items()} if entry else None
    groups = conn.xinfo_groups(stream)
    since = entry_id.split("-")[0]  # letters and replays come after the entry, so read from its time on
    found = Found(entry_id, fields)
    if fields is None:
        # Past the stream's last id, the entry never was; below it, it may have been deleted or trimmed.
        last = _text(conn.xinfo_stream(stream)["last-generated-id"])
        if id_key(entry_id) > id_key(last):
            found.absence = f"not in the stream: past its last entry id {last}"
            # No group can have read, failed or replayed it: "not yet delivered" would say it waits.
            found.places = [Place(to_shown(info["name"]), "not published",
                                  f"beyond the stream's last entry {last}: no such entry (not published yet)")
                            for info in groups]
            return found, False
        found.absence = "not in the stream: deleted or trimmed, or never there"
    try:
        letters, letters_cut = _scan_forward(conn, keys.dead_letter_key(stream), since,
                                             lambda f: _field(f, "shoal:origin_id") == entry_id)
    except redis.ResponseError as exc:
        if not is_wrongtype(exc):
            raise
        # The other places (pending, handled...) still say where the entry is.
        letters, letters_cut = [], False
        found.problem = (f"{_not_a_stream(conn, keys.dead_letter_key(stream))}: its dead letters cannot be looked "
                         "for.")
    replays, replays_cut = _scan_forward(conn, stream, since, lambda f: _field(f, REPLAY_OF) == entry_id)
    target = _raw_field(entry[0][1], TARGET_GROUP) if entry else None
    for info in groups:
        found.places.append(_place(conn, stream, info["name"], entry_id, target, _text(info["last-delivered-id"]),
                                   letters, replays))
    return found, letters_cut or replays_cut


def _not_a_stream(conn, key):
    return f"Redis key {key!r} holds a {_text(conn.type(key))}, not a stream"


def _place(conn, stream, name, entry_id, target, last_delivered, letters, replays):
    """Where the entry is for the group ``name`` (as Redis holds it: sent back as those bytes, compared
    as bytes, shown escaped: another client's group may be named in bytes that are not UTF-8)."""
    group, raw = to_shown(name), name_bytes(name)
    if target is not None and name_bytes(target) != raw:
        return Place(group, "not for this group", f"a replay for group {to_shown(target)}: acknowledged unseen")
    rows = conn.xpending_range(stream, name, min=entry_id, max=entry_id, count=1)
    if rows:
        row = rows[0]
        error_key = keys.error_key(stream, _text(name), entry_id)  # as the pending page reads it
        try:
            error = conn.hget(error_key, "error")
        except redis.ResponseError as exc:
            if not is_wrongtype(exc):
                raise
            error = f"(Redis key {error_key!r} holds a {keys.key_type(conn, error_key)}, not a hash)"
        detail = (f"owner {to_shown(row['consumer'])}, idle {row['time_since_delivered'] / 1000:.1f} s, "
                  f"{row['times_delivered']} deliveries" + (f"; last error: {_text(error)}" if error else ""))
        from streams_app.models import ConsumerGroup

        mirrored = ConsumerGroup.objects.filter(stream__name=stream, name=group).first()
        url = reverse("admin:streams_app_consumergroup_pending", args=[mirrored.pk]) if mirrored else ""
        return Place(group, "pending", detail, url)
    for letter_id, fields in letters:
        if name_bytes(failed_by(fields)) == raw:
            letter = parse_dead_letter(letter_id, fields)
            from streams_app.models import DeadLetter

            row = DeadLetter.objects.filter(stream=stream, entry_id=letter_id).first()
            url = reverse("admin:streams_app_deadletter_change", args=[row.pk]) if row else ""
            return Place(group, "dead-lettered", f"dead letter {letter_id}: {letter.error[:200]}", url)
    for new_id, fields in replays:
        if name_bytes(_raw_field(fields, TARGET_GROUP)) == raw:
            return Place(group, "replayed", f"as entry {new_id}")
    if id_key(entry_id) <= id_key(last_delivered):
        return Place(group, "handled", "delivered and acknowledged (no longer pending)")
    return Place(group, "not yet delivered", f"the group has read up to {last_delivered}")


def find_message(model_admin, request):
    from streams_app.models import Stream

    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    stream = request.GET.get("stream", "")
    query = request.GET.get("q", "").strip()[:500]
    results, problem, cut = [], "", False
    if stream and query:
        conn = page_connection(request)
        try:
            ids, cut = ([query], False) if is_entry_id(query) else by_key(conn, stream, query)
            if not ids:
                problem = f"No entry with id or key {query!r} in the newest {SCAN_LIMIT:,} entries of {stream}."
            for entry_id in ids:
                found, more = locate(conn, stream, entry_id)
                results.append(found)
                cut = cut or more
        except redis.ResponseError as exc:
            if is_wrongtype(exc):
                problem = f"{_not_a_stream(conn, stream)}; Shoal leaves it as it is."
            elif is_missing(exc):
                problem = f"Stream {stream} does not exist in Redis (or has no groups)."
            else:
                raise
        except TRANSIENT_ERRORS as exc:
            problem = f"Redis is unreachable ({type(exc).__name__}: {exc}); try again when it is back."
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Find a message",
        "subtitle": None,
        "opts": model_admin.model._meta,
        "streams": list(Stream.objects.values_list("name", flat=True)),
        "stream": stream,
        "query": query,
        "results": results,
        "problem": problem,
        "cut": cut,
        "scan_limit": SCAN_LIMIT,
        "self_url": request.path + "?" + urlencode({"stream": stream, "q": query}),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/streams_app/consumergroup/find.html", context)
