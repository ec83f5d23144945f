"""A group's pending entries: why each is pending, when it is retried, and the actions on them.

Read a page at a time (XPENDING from a cursor, then that page's payloads and last errors in one
pipeline), so 100,000 pending entries cost what 50 do. Filters: the owner and a minimum idle time
are XPENDING's own; a minimum delivery count is applied to what XPENDING returns, scanning at most
SCAN_LIMIT entries per page (the page then says how far it looked).

When is an entry retried? Its owner retries a failed entry itself after the back-off of its
delivery count; any live consumer takes it over once it has been idle for the larger of the
pending timeout and that back-off, or at once after the back-off when its owner is known dead
(streams_app/consuming/loop.py, retry.py). "Retry now" and "claim" set the entry's idle time
(XCLAIM IDLE, JUSTID: no delivery is counted) past all of those, so the next claim pass of a live
consumer (every CLAIM_INTERVAL_MS) takes it.
"""
from dataclasses import dataclass

import redis
from django.contrib import messages
from django.contrib.admin.models import CHANGE
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from shoal_common.redis_errors import is_missing, is_wrongtype, may_have_run
from shoal_common.text import to_text
from streams_app.redis import keys
from streams_app.admin import mirror
from streams_app.admin.consumers import ALIVE, DEAD, group_consumers, wrong_type_problem
from streams_app.admin.refresh import refresh_context
from streams_app.admin.support import check_entry_ids, confirmation, log_actions
from streams_app.conf import get_settings
from streams_app.redis.connection import TRANSIENT_ERRORS, page_connection, web_connection
from streams_app.consuming.retry import backoff_policy, backoff_seconds, claimable_idle_ms
from streams_app.deadletters import store as deadletters
from streams_app.models import MirrorState
from streams_app.registry import registered
from streams_app.redis.lag import find_group, from_shown, to_shown

PENDING_PAGE_SIZE = 50
PAYLOAD_PREVIEW = 120
SCAN_LIMIT = 5000  # entries one page looks through for a minimum delivery count
BULK_BATCH = 500  # pending entries per XPENDING read and per action call of a bulk action
CONFIRM_LISTED = 100
PENDING_ACTIONS = {
    # name: (permission, label, verb for messages)
    "retry": ("retry", "Retry now", "Made due now"),
    "claim": ("claim", "Claim to a consumer (due at once)", "Claimed"),
    "ack": ("ack", "Acknowledge without processing", "Acknowledged"),
    "deadletter": ("deadletter", "Move to the dead letters", "Moved to the dead letters"),
}
ACK_WARNING = ("Acknowledging skips processing: the handler will never run for these entries, and they "
               "will not reach the dead letters either.")
RUNNING_WARNING = ("An entry a live consumer is running right now (no error recorded, idle a few seconds) may then "
                   "run a second time.")


def _text(value):
    # Entries come from any producer: bytes that are not UTF-8 are shown escaped (\\xNN), never a 500.
    return to_text(value, errors="backslashreplace")


def owner_value(name):
    """A consumer name as the page's forms send it: "=" and the name. Any text can be a consumer's
    name, the empty one too, so no name may stand for "any owner" or "none chosen" ("")."""
    return "=" + name


def parse_owner(value):
    """A consumer name from a form or a link: None when none was chosen (""), the name after "=" (as
    the forms send it), else the value itself (as links and scripts pass a plain name)."""
    if not value:
        return None
    return value[1:] if value.startswith("=") else value


def owner_label(name):
    return name if name else "(empty name)"


@dataclass(frozen=True)
class Filters:
    consumer: str | None = None  # None: any owner; "" is the consumer named ""
    min_idle: float = 0.0  # seconds
    min_deliveries: int = 0

    @property
    def active(self):
        return bool(self.consumer is not None or self.min_idle or self.min_deliveries)

    def query(self):
        owner = "" if self.consumer is None else (
            self.consumer if self.consumer and not self.consumer.startswith("=") else owner_value(self.consumer))
        return {k: v for k, v in (("consumer", owner), ("min_idle", f"{self.min_idle:g}" if self.min_idle else ""),
                                  ("min_deliveries", self.min_deliveries or "")) if v}


def _pending_range(conn, stream, group, start, count, filters):
    """XPENDING's extended form with the filters of its own (owner, idle). Sent as a command: redis-py's
    ``xpending_range`` leaves a consumer named "" out, which would list every owner's entries."""
    args = [stream, group, *(["IDLE", int(filters.min_idle * 1000)] if filters.min_idle else []), start, "+", count]
    if filters.consumer is not None:
        args.append(from_shown(filters.consumer))  # the bytes Redis holds for the name as shown
    return conn.execute_command("XPENDING", *args, parse_detail=True)


def describe(filters):
    parts = [f"owner {owner_label(filters.consumer)}"] if filters.consumer is not None else []
    parts += [f"idle at least {filters.min_idle:g} s"] if filters.min_idle else []
    parts += [f"at least {filters.min_deliveries} deliveries"] if filters.min_deliveries else []
    return ", ".join(parts)


def parse_filters(params):
    """Filters from the query string; (Filters, problems) where a malformed value is left out and named."""
    problems, values = [], {"consumer": parse_owner(params.get("consumer", "")[:301])}
    for name, kind in (("min_idle", float), ("min_deliveries", int)):
        raw = params.get(name, "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
            if not 0 <= value < 10**12:
                raise ValueError
        except ValueError:
            problems.append(f"The filter {name}={raw!r} is not a number of {'seconds' if kind is float else 'deliveries'} "
                            "(0 or more); it was ignored")
            continue
        values[name] = value
    return Filters(**values), problems


def read_pending_page(conn, stream, group, after=None, count=PENDING_PAGE_SIZE, filters=Filters()):
    """One page of pending entries after id ``after``: (rows, next cursor or None).

    Without a delivery filter: one XPENDING and one pipeline, whatever the PEL's size.
    """
    start = "(" + after if after else "-"
    rows, more, scanned = [], False, 0
    while True:
        batch_size = count + 1 if not filters.min_deliveries else max(200, count * 4)
        batch = _pending_range(conn, stream, group, start, batch_size, filters)
        scanned += len(batch)
        for row in batch:
            if row["times_delivered"] >= filters.min_deliveries:
                rows.append(row)
        if len(rows) > count:
            more, rows = True, rows[:count]
            break
        if len(batch) < batch_size:
            break
        start = "(" + _text(batch[-1]["message_id"])
        if scanned >= SCAN_LIMIT:
            # Looked far enough for one page: "next" goes on from the last entry looked at.
            return _with_details(conn, stream, group, rows), _text(batch[-1]["message_id"])
    page = _with_details(conn, stream, group, rows)
    return page, (page[-1]["id"] if more and page else None)


def _with_details(conn, stream, group, rows):
    pipe = conn.pipeline(transaction=False)
    for row in rows:
        entry_id = _text(row["message_id"])
        pipe.xrange(stream, min=entry_id, max=entry_id)
        pipe.hmget(keys.error_key(stream, _text(group), entry_id), "error", "at")
    found = pipe.execute(raise_on_error=False) if rows else []
    page = []
    for row, entry, record in zip(rows, found[0::2], found[1::2]):
        if isinstance(entry, Exception):
            raise entry
        if isinstance(record, Exception):
            if not is_wrongtype(record):
                raise record
            # One error record of another type must not hide the whole list: that entry says so.
            key = keys.error_key(stream, _text(group), _text(row["message_id"]))
            record = (wrong_type_problem(conn, key, "hash", "the last error cannot be read"), None)
        error, at = record
        fields = {_text(k): _text(v) for k, v in entry[0][1].items()} if entry else None
        payload = "(deleted from the stream)" if fields is None else fields.get("payload", fields.get("data", ""))
        page.append({
            "id": _text(row["message_id"]),
            "consumer": to_shown(row["consumer"]),
            "idle": row["time_since_delivered"] / 1000,
            "deliveries": row["times_delivered"],
            "payload": payload[:PAYLOAD_PREVIEW] + ("…" if len(payload) > PAYLOAD_PREVIEW else ""),
            "error": _text(error) if error is not None else "",
            "error_at": mirror.ms_to_datetime(_text(at)) if at is not None and _text(at).isdigit() else None,
        })
    return page


class RetryPolicy:
    """The group's retry rules as its consumers apply them (its @consumer's, or the STREAMS defaults)."""

    def __init__(self, stream, group):
        config = get_settings()
        group = _text(group)  # the group's name as Redis holds it, from an action: registered names are text
        spec = next((s for s in registered() if s.stream == stream and s.group == group), None)
        self.base, self.cap = backoff_policy(spec, config) if spec else (config["RETRY_BACKOFF"],
                                                                       max(config["RETRY_BACKOFF"], config["RETRY_BACKOFF_MAX"]))
        self.pending_timeout_ms = config["PENDING_TIMEOUT_MS"]
        self.max_deliveries = spec.max_deliveries if spec else None

    def at_limit(self, entry):
        """At its delivery limit: the next claim pass past the pending timeout moves it to the dead letters."""
        return self.max_deliveries is not None and entry["deliveries"] >= self.max_deliveries

    def due_in(self, entry, liveness):
        """Seconds until a consumer may deliver ``entry`` again (0: due at the next claim pass)."""
        idle_ms = entry["idle"] * 1000
        if self.at_limit(entry):
            return max(0.0, (self.pending_timeout_ms - idle_ms) / 1000)
        takeover = claimable_idle_ms(entry["deliveries"], self.base, self.cap, self.pending_timeout_ms)
        own = backoff_seconds(entry["deliveries"], self.base, self.cap) * 1000
        if liveness == DEAD or (liveness == ALIVE and entry["error"]):
            takeover = min(takeover, own)  # a dead owner's entries wait for the back-off only; a live one retries its own
        return max(0.0, (takeover - idle_ms) / 1000)

    def due_idle_ms(self):
        """An idle time past every wait of every delivery count: the entry is due for any consumer."""
        return max(self.pending_timeout_ms, int(self.cap * 1000)) + 1000


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
    filters, problems = parse_filters(request.GET)
    for problem in problems:
        model_admin.message_user(request, problem, messages.WARNING)
    stream = group.stream.name
    copied, name = None, from_shown(group.name)  # the bytes Redis holds for the name as shown
    try:
        summary = conn.xpending(stream, name)
        page, next_after = read_pending_page(conn, stream, name, after, filters=filters)
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
    problems = []
    consumers = group_consumers(conn, stream, name, problems)
    for problem in problems:
        model_admin.message_user(request, problem, messages.WARNING)
    liveness = {c.name: c.liveness for c in consumers}
    policy = RetryPolicy(stream, name)
    for entry in page:
        entry["liveness"] = liveness.get(entry["consumer"], "unknown")
        entry["due_in"] = policy.due_in(entry, entry["liveness"])
        entry["to_dead_letters"] = policy.at_limit(entry)
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
        "filters": filters,
        "owners": [(owner_value(name), owner_label(name), name == filters.consumer) for name in
                   sorted({*(c.name for c in consumers), *([] if filters.consumer is None else [filters.consumer])})],
        "claim_targets": [(owner_value(c.name), owner_label(c.name), c) for c in consumers if c.claimable],
        "next_url": f"?{urlencode({**filters.query(), 'after': next_after})}" if next_after else "",
        "first_url": request.path + (f"?{urlencode(filters.query())}" if filters.active else "") if after else "",
        "actions": [(name, spec[1]) for name, spec in allowed.items()],
        "consumers": consumers,
        "pending_timeout": policy.pending_timeout_ms / 1000,
        "claim_interval": get_settings()["CLAIM_INTERVAL_MS"] / 1000,
        "group_url": reverse("admin:streams_app_consumergroup_change", args=[group.pk]),
        **refresh_context(request),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/streams_app/consumergroup/pending.html", context)


def matching(conn, stream, group, filters, batch=BULK_BATCH):
    """Every pending entry matching ``filters``, oldest first, as XPENDING rows in batches: what a
    bulk action works through on the server, page after page, however many there are."""
    start = "-"
    while True:
        rows = _pending_range(conn, stream, group, start, batch, filters)
        chosen = [r for r in rows if r["times_delivered"] >= filters.min_deliveries]
        if chosen:
            yield chosen
        if len(rows) < batch:
            return
        start = "(" + _text(rows[-1]["message_id"])


def _pending_action(model_admin, request, group, allowed):
    action = request.POST.get("action", "")
    if action not in PENDING_ACTIONS:
        raise Http404("no such action")
    if action not in allowed:
        raise PermissionDenied
    across = request.POST.get("select_across") == "1"
    ids = [] if across else check_entry_ids(request.POST.getlist("entry"))
    stream = group.stream.name
    target = parse_owner(request.POST.get("consumer", ""))
    back = request.get_full_path()
    conn = web_connection()
    name = from_shown(group.name)
    if action == "claim":
        refused = _claim_refusal(conn, stream, group, name, target)
        if refused:
            model_admin.message_user(request, refused + " Nothing was claimed.", messages.ERROR)
            return HttpResponseRedirect(back)
    if not request.POST.get("post"):
        interval = get_settings()["CLAIM_INTERVAL_MS"] / 1000
        warning = {
            "ack": ACK_WARNING,
            "retry": f"Each entry stays with its consumer but becomes due at once: the next claim pass of a live "
                     f"consumer of the group (every {interval:g} s) delivers it, whatever its back-off. Delivery "
                     f"counts stay as they are. " + RUNNING_WARNING,
            "claim": f"The entries become pending for consumer {owner_label(target or '')} and due at once: its next claim pass (every "
                     f"{interval:g} s) delivers them, or another live consumer's if it comes first. Delivery counts "
                     f"stay as they are. " + RUNNING_WARNING,
            "deadletter": "The entries leave the group's pending list and go to the dead-letter stream, from where "
                          "they can be replayed.",
        }[action]
        if across:
            filters, _ = parse_filters(request.GET)
            found = [_text(r["message_id"]) for rows in matching(conn, stream, name, filters, batch=1000)
                     for r in rows]
            if not found:
                model_admin.message_user(request, "No pending entry matches the filter: nothing to do.", messages.WARNING)
                return HttpResponseRedirect(back)
            warning += (" Every entry matching the filter when you confirm is included, across all pages"
                        f"{' (' + describe(filters) + ')' if filters.active else ''}; the count below is as of now.")
            return confirmation(request, model_admin, title=f"{PENDING_ACTIONS[action][1]}: {group}", action=action,
                                items=[f"{stream} {i}" for i in found[:CONFIRM_LISTED]], warning=warning,
                                hidden={"consumer": owner_value(target)} if target is not None else None,
                                select_across=True,
                                count=len(found), form_action=back, id_field="entry")
        return confirmation(request, model_admin, title=f"{PENDING_ACTIONS[action][1]}: {group}", action=action,
                            items=[f"{stream} {i}" for i in ids], warning=warning,
                            hidden={"consumer": owner_value(target)} if target is not None else None,
                            ids=ids, form_action=back, id_field="entry")
    failure, in_flight = None, []
    if across:
        filters, _ = parse_filters(request.GET)
        done, batches = [], []
        try:
            for rows in matching(conn, stream, name, filters):
                in_flight = rows
                batch = _act(conn, request, stream, name, action,
                             {_text(r["message_id"]): r["consumer"] for r in rows}, target)
                in_flight = []
                done += batch
                batches.append(batch)
        except TRANSIENT_ERRORS as exc:  # what the batches before did is reported and audited below
            failure = exc
        ids = done
    else:
        done = _apply(conn, request, stream, name, action, ids, target)
    gone = len(ids) - len(done)
    verb = PENDING_ACTIONS[action][2]
    to = f" to consumer {owner_label(target)}" if action == "claim" else ""
    if across:
        # One LogEntry per batch, naming each of its entries: 50,000 rows would cost more than the action.
        where = f" matching {describe(filters)}" if filters.active else ""
        log_actions(request, type(group), [(group.pk, f"{group} ({len(b)} entries)",
                                            f"{verb} {len(b)} pending entries{where}{to}: {', '.join(b)}")
                                           for b in batches if b], CHANGE)
    else:
        log_actions(request, type(group), [(group.pk, f"{group} {i}", f"{verb} pending entry {i}{to}") for i in done],
                    CHANGE)
    if failure is not None:
        doubt = len(in_flight) if may_have_run(failure) else 0
        model_admin.message_user(
            request, f"{verb} {len(done)} pending entr{'ies' if len(done) != 1 else 'y'} of {group} before Redis "
                     f"failed ({type(failure).__name__}: {failure})"
                     + (f"; the next {doubt} may or may not have been (sent, and Redis did not answer)" if doubt else "")
                     + "; the others were not. Do it again when Redis is back: the page lists what is still pending.",
            messages.ERROR)
        return HttpResponseRedirect(back)
    if done:
        model_admin.message_user(request, f"{verb} {len(done)} pending entr{'ies' if len(done) != 1 else 'y'} of {group}.",
                                 messages.SUCCESS)
    if gone:
        model_admin.message_user(request, f"{gone} of the entries were no longer pending (handled, claimed or moved "
                                          "meanwhile); nothing was done to them.", messages.WARNING)
    mirror.try_sync(conn)
    return HttpResponseRedirect(back)


def _claim_refusal(conn, stream, group, name, target):
    """Why ``target`` cannot take claimed entries (None: it can), saying what is actually wrong.
    ``name``: the group's name as Redis holds it."""
    consumers = {c.name: c for c in group_consumers(conn, stream, name)}
    if target in consumers and consumers[target].claimable:
        return None
    offered = "the list offers the group's consumers and live readers of the stream"
    if target is None:
        return f"Choose a consumer to claim the entries to ({offered})."
    if not consumers and not _group_exists(conn, stream, name):
        return f"Group {group} no longer exists in Redis."
    if target not in consumers:
        return f"Group {group} has no consumer named {owner_label(target)!r}: choose one that exists ({offered})."
    return f"Consumer {owner_label(target)!r} is dead (its liveness lapsed): choose one that is not ({offered})."


def _group_exists(conn, stream, group):
    try:
        return find_group(conn.xinfo_groups(stream), group) is not None
    except redis.ResponseError as exc:
        if is_missing(exc):
            return False
        raise


def _apply(conn, request, stream, group, action, ids, target):
    """Do ``action`` on the ids that are still pending; return those ids."""
    pipe = conn.pipeline(transaction=False)
    for entry_id in ids:
        pipe.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    owners = {i: rows[0]["consumer"] for i, rows in zip(ids, pipe.execute()) if rows}
    return _act(conn, request, stream, group, action, owners, target) if owners else []


def _act(conn, request, stream, group, action, owners, target):
    """Do ``action`` on pending entries (id -> owner, as Redis gave it); return the ids it was done to.

    Owners stay the bytes Redis holds and a claim's target (the page's text) is read back to its
    bytes (from_shown): a name that is not UTF-8 is shown escaped, and claiming to the escaped text
    would make a new consumer nobody runs."""
    still = list(owners)
    if action == "ack":
        conn.xack(stream, group, *still)
        return still
    if action in ("retry", "claim"):
        # IDLE past every wait: due for the next claim pass. JUSTID: an operator's move is not a
        # delivery, so the counts stay honest. (A plain XCLAIM would reset the idle time and delay
        # the entry by a whole pending timeout.)
        idle = RetryPolicy(stream, group).due_idle_ms()
        to = from_shown(target) if action == "claim" else None
        by_owner = {}
        for entry_id in still:
            by_owner.setdefault(to if action == "claim" else owners[entry_id], []).append(entry_id)
        pipe = conn.pipeline(transaction=False)
        for owner, owned in by_owner.items():
            pipe.xclaim(stream, group, owner, min_idle_time=0, message_ids=owned, idle=idle, justid=True)
        return [_text(i) for claimed in pipe.execute() for i in claimed]
    pipe = conn.pipeline(transaction=False)
    for entry_id in still:
        pipe.hexists(keys.error_key(stream, _text(group), entry_id), "error")
    # A last-error record of another type counts as none: the move records the admin's note instead.
    recorded = [r is True for r in pipe.execute(raise_on_error=False)]
    note = f"moved to the dead letters by {request.user.get_username()} from the admin"
    result = deadletters.move(conn, stream, group, [(i, "" if r else note, "") for i, r in zip(still, recorded)])
    return [entry_id for entry_id, _ in result.moved]
