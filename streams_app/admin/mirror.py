"""Copying Redis state into the admin's mirror models (Stream, ConsumerGroup, DeadLetter).

Redis is the source of truth; the rows are a copy the admin can search, filter and sort. The
reclaim daemon syncs every pass and the admin syncs when a page opens; ``MirrorState`` records
when the last sync succeeded, so a page whose sync failed can say how old its numbers are.

Dead letters are copied incrementally: each Stream row keeps the highest dead-letter id copied
(``dlq_cursor``) and a sync reads only past it. Rows whose entry left the DLQ (replayed or deleted
by someone else) are found by comparing counts, and only then checked id by id.

Redis holds bytes written by anyone; the copy must hold whatever the database can. Invalid UTF-8
becomes ``\\xNN`` escapes and NUL becomes ``\\x00`` (PostgreSQL text cannot contain it). Each
stream is copied in a transaction of its own: a row that still fails costs that stream's copy
(recorded in MirrorState, shown on every page), never the other streams', the page or the
reclaim pass. Redis stays untouched: actions read the real entries from Redis, not the copy.
"""
import logging
import re
from datetime import datetime, UTC

import redis
from django.db import DatabaseError, transaction
from django.utils import timezone as dj_timezone

from shoal_common.mirrors import sync_registered
from shoal_common.text import to_text
from streams_app.redis import keys
from streams_app.conf import get_settings
from streams_app.redis.entry_ids import id_key
from streams_app.redis.lag import to_shown
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection
from streams_app.partitioning import partitions
from streams_app.registry import registered

logger = logging.getLogger("streams_app.sync")

STREAMS_MIRROR = "streams"
DLQ_PAGE = 500
# A page that opens copies at most this many new dead letters (a first sync of a huge DLQ must not
# hold up a request); the reclaim daemon copies without a limit.
PAGE_DLQ_LIMIT = 5000
# Counting stale pending entries reads them; past this many the admin says "100+".
STALE_PENDING_CAP = 100
_ERROR_TYPE = re.compile(r"^([A-Za-z_][\w.]*)\s*:")


def _text(value):
    """A Redis reply as text the database can store (see the module docstring)."""
    value = to_text(value, errors="backslashreplace")
    if isinstance(value, str) and "\x00" in value:
        value = value.replace("\x00", "\\x00")
    return value


def entry_sort_key(entry_id):
    """'299-10' -> '00000000000000000299-00000000000000000010': sorts as Redis orders ids (ms, then seq)."""
    ms, _, seq = entry_id.partition("-")
    try:
        return f"{int(ms):020d}-{int(seq or 0):020d}"
    except ValueError:
        return ""


def ms_to_datetime(ms):
    return datetime.fromtimestamp(int(ms) / 1000, UTC)


def error_type(error):
    """'ValueError: bad' -> 'ValueError'; 'decode: ...' -> 'decode'; anything else -> 'other'."""
    match = _ERROR_TYPE.match(error or "")
    return match.group(1) if match else "other"


_id_key = id_key


# -- streams and groups -----------------------------------------------------------------------

def sync_streams(conn=None, specs=None, now=None, dlq_limit=None, failures=None):
    """Refresh every Stream and ConsumerGroup row (streams of registered consumers plus those already
    mirrored), and copy new dead letters. Returns the Stream rows copied.

    A stream whose copy fails is skipped and recorded in ``failures`` (name -> error); Redis
    connection errors are raised (nothing more can be read).
    """
    from streams_app.models import Stream

    conn = conn or get_connection()
    specs = registered() if specs is None else specs
    now = now or dj_timezone.now()
    failures = {} if failures is None else failures
    by_group = {(s.stream, to_shown(s.group)): s for s in specs}
    known = {s.stream for s in specs} | set(Stream.objects.values_list("name", flat=True))
    # The partitions of declared partitioned streams too, once in Redis: the web process need not
    # register their consumers for the logical stream's page to show them.
    names = sorted(known | set(_declared_partitions()))
    timeout = get_settings()["PENDING_TIMEOUT_MS"]

    pipe = conn.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
        pipe.type(keys.dead_letter_key(name))
    kinds = [_text(kind) for kind in pipe.execute()]
    stream_kinds, dlq_kinds = dict(zip(names, kinds[0::2])), dict(zip(names, kinds[1::2]))
    names = [n for n in names if n in known or stream_kinds[n] != "none" or dlq_kinds[n] != "none"]
    infos = {}
    pipe = conn.pipeline(transaction=False)
    live = [n for n in names if stream_kinds[n] == "stream"]
    for name in live:
        pipe.xinfo_stream(name)
        pipe.xinfo_groups(name)
    for name, stream_info, groups in zip(live, *[iter(pipe.execute())] * 2):
        infos[name] = (stream_info, groups)
    pipe = conn.pipeline(transaction=False)
    readable_dlqs = [n for n in names if dlq_kinds[n] == "stream"]
    for name in readable_dlqs:
        pipe.xlen(keys.dead_letter_key(name))
    for name in names:
        pipe.zcard(keys.scheduled_key(name))  # deferred messages (streams_app/publishing/scheduled.py)
    replies = pipe.execute(raise_on_error=False)
    dlq_lengths = dict(zip(readable_dlqs, replies))
    failed = next((r for r in dlq_lengths.values() if isinstance(r, Exception)), None)
    if failed is not None:
        raise failed
    waiting = {name: count if isinstance(count, int) else 0 for name, count in zip(names, replies[len(readable_dlqs):])}

    stale = _stale_pending(conn, infos, timeout)
    alive = _alive_consumers(conn, infos)
    rows = []
    for name in names:
        problems = [f"Redis key {key!r} holds a {kind}, not a stream; Shoal leaves it as it is"
                    for key, kind in ((name, stream_kinds[name]), (keys.dead_letter_key(name), dlq_kinds[name]))
                    if kind not in ("stream", "none")]
        try:
            with transaction.atomic():
                stream = _sync_stream(conn, name, infos.get(name, ({}, [])), dlq_lengths.get(name, 0), by_group,
                                      (stale, alive), now, "; ".join(problems), waiting[name])
                if name in dlq_lengths:
                    sync_dead_letters(stream, conn=conn, now=now, limit=dlq_limit)
                else:
                    forget_dead_letters(stream)
                _count_group_dead_letters(stream)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:  # one stream's data must not stop the copy of the others
            failures[name] = f"{type(exc).__name__}: {exc}"
            logger.warning("Mirror: could not copy stream %s (%s); the other streams are copied", name,
                           failures[name], exc_info=not isinstance(exc, (DatabaseError, redis.ResponseError)))
            continue
        rows.append(stream)
    return rows


def _declared_partitions():
    declared = get_settings()["PARTITIONS"]
    return [name for stream in (declared if isinstance(declared, dict) else {}) if partitions.is_partitioned(stream) for name in partitions.reading(stream)]


def _sync_stream(conn, name, info, dlq_length, by_group, counts, now, problem, scheduled=0):
    from streams_app.models import ConsumerGroup, Stream
    from streams_app.redis.lag import backlog

    stream_info, groups = info
    stale, alive = counts
    stream, _ = Stream.objects.update_or_create(name=name, defaults={
        "length": stream_info.get("length", 0),
        "groups": len(groups),
        "dead_letters": dlq_length,
        "last_id": _text(stream_info.get("last-generated-id") or ""),
        "scheduled": scheduled,
        "exists": bool(stream_info),
        "problem": problem[:300],
        "synced_at": now,
    })
    seen = []
    for group_info in groups:
        group = to_shown(group_info["name"])  # reversible: two groups never share a row, each is reachable
        spec = by_group.get((name, group))
        seen.append(group)
        last_delivered = _text(group_info["last-delivered-id"])
        # Null lag (an unread entry deleted, the stream trimmed) is counted, not taken for zero; so is
        # a lag a Redis before 7.4 overstates after a failover.
        lag, estimated = backlog(conn, name, group_info)
        ConsumerGroup.objects.update_or_create(stream=stream, name=group, defaults={
            "lag": lag,
            "lag_estimated": estimated,
            "pending": group_info["pending"],
            "stale_pending": stale.get((name, group), 0),
            "consumers": group_info["consumers"],
            "live_consumers": alive.get((name, group)),
            "last_delivered_id": last_delivered,
            "entries_read": group_info.get("entries-read"),
            "handler": spec.handler_path[:300] if spec else "",
            "max_deliveries": spec.max_deliveries if spec else None,
            "synced_at": now,
        })
    stream.consumer_groups.exclude(name__in=seen).delete()
    return stream


def _alive_consumers(conn, infos):
    """(stream, group) -> consumers of the group whose liveness deadline is ahead (admin/consumers.py).

    A SIGKILLed worker stays a consumer of its groups; its deadline lapses within CONSUMER_TTL.
    """
    from streams_app.admin.consumers import deadlines

    # Asked under the names as Redis holds them (a group's name may not be UTF-8), keyed as mirrored.
    asked = [(name, g["name"]) for name, (_, groups) in infos.items() for g in groups]
    if not asked:
        return {}
    pipe = conn.pipeline(transaction=False)
    for name, group in asked:
        pipe.xinfo_consumers(name, group)
    rows = pipe.execute(raise_on_error=False)
    by_stream = {}
    out = {}
    for (name, group), members in zip(asked, rows):
        if isinstance(members, Exception):
            continue
        if name not in by_stream:
            by_stream[name] = deadlines(conn, name)
        out[(name, to_shown(group))] = sum(1 for m in members if by_stream[name].get(to_shown(m["name"]), 0) > 0)
    return out


def _stale_pending(conn, infos, timeout_ms):
    """(stream, group) -> pending entries idle past the timeout, counted up to STALE_PENDING_CAP."""
    asked = [(name, g["name"]) for name, (_, groups) in infos.items() for g in groups if g["pending"]]
    if not asked:
        return {}
    pipe = conn.pipeline(transaction=False)
    for name, group in asked:
        pipe.xpending_range(name, group, min="-", max="+", count=STALE_PENDING_CAP, idle=timeout_ms)
    return {(name, to_shown(group)): len(rows) for (name, group), rows in zip(asked, pipe.execute(raise_on_error=False))
            if not isinstance(rows, Exception)}


def dead_letters_by_group(stream):
    """{group: dead letters of that group} for one stream, counted in the copied DeadLetter rows.

    A dead letter names the group that failed it; the stream's DLQ length counts every group's.
    Exact once the copy has caught up (the reclaim daemon copies every letter each pass).
    """
    from django.db.models import Count

    from streams_app.models import DeadLetter

    return dict(DeadLetter.objects.filter(stream=stream).order_by().values_list("group").annotate(n=Count("pk")))


def _count_group_dead_letters(stream):
    counts = dead_letters_by_group(stream.name)
    for group in stream.consumer_groups.all():
        if group.dead_letters != counts.get(group.name, 0):
            group.dead_letters = counts.get(group.name, 0)
            group.save(update_fields=["dead_letters"])


# -- dead letters -----------------------------------------------------------------------------

def dead_letter_row(stream, entry_id, fields, now):
    from streams_app.deadletters.store import PACKED_FIELDS
    from streams_app.deadletters.store import DeadLetter as Letter
    from streams_app.models import DeadLetter

    decoded = {_text(k): _text(v) for k, v in fields.items()}
    packed = fields.get(PACKED_FIELDS.encode(), fields.get(PACKED_FIELDS))
    if packed is not None:
        decoded[PACKED_FIELDS] = packed  # unpacked from the raw bytes: netstring lengths count bytes
    letter = Letter(_text(entry_id), decoded)
    original = {_text(k): _text(v) for k, v in letter.original_fields.items()}
    failed_at = letter.failed_at
    return DeadLetter(
        stream=stream,
        entry_id=letter.id,
        entry_sort=entry_sort_key(letter.id),
        origin_id=letter.origin_id,
        group=letter.group,
        consumer=letter.consumer,
        deliveries=letter.deliveries,
        error=letter.error,
        error_type=error_type(letter.error)[:200],
        traceback=letter.traceback,
        failed_at=ms_to_datetime(str(failed_at)) if failed_at is not None else None,
        payload=original.get("payload", original.get("data", "")),
        fields=original,
        synced_at=now,
    )


def sync_dead_letters(stream, conn=None, now=None, limit=None):
    """Copy dead letters past ``stream.dlq_cursor`` (about ``limit`` at most); drop rows whose entry left the DLQ."""
    from streams_app.models import DeadLetter

    conn = conn or get_connection()
    now = now or dj_timezone.now()
    key = keys.dead_letter_key(stream.name)
    cursor = stream.dlq_cursor
    newest = conn.xrevrange(key, max="+", min="-", count=1)
    if not newest or _id_key(_text(newest[0][0])) < _id_key(cursor):
        cursor = "0-0"  # the DLQ is empty or was recreated: nothing past the old cursor exists
    copied = 0
    while newest:
        page = conn.xrange(key, min="(" + cursor, max="+", count=DLQ_PAGE)
        if not page:
            break
        DeadLetter.objects.bulk_create([dead_letter_row(stream.name, i, f, now) for i, f in page],
                                       ignore_conflicts=True)
        copied += len(page)
        cursor = _text(page[-1][0])
        if len(page) < DLQ_PAGE or (limit is not None and copied >= limit):
            break
    if cursor != stream.dlq_cursor:
        stream.dlq_cursor = cursor
        stream.save(update_fields=["dlq_cursor"])
    prune_dead_letters(stream.name, conn=conn)
    return copied


def prune_dead_letters(stream, conn=None):
    """Delete DeadLetter rows whose entry is no longer in Redis. Every entry up to the cursor has a
    row, so equal counts mean nothing to prune; only a difference costs an id-by-id check."""
    from streams_app.models import DeadLetter

    conn = conn or get_connection()
    key = keys.dead_letter_key(stream)
    rows = DeadLetter.objects.filter(stream=stream)
    if rows.count() <= conn.xlen(key):
        return 0
    gone = []
    ids = list(rows.values_list("entry_id", flat=True))
    for start in range(0, len(ids), DLQ_PAGE):
        batch = ids[start : start + DLQ_PAGE]
        pipe = conn.pipeline(transaction=False)
        for entry_id in batch:
            pipe.xrange(key, min=entry_id, max=entry_id)
        gone += [i for i, found in zip(batch, pipe.execute()) if not found]
    for start in range(0, len(gone), DLQ_PAGE):
        DeadLetter.objects.filter(stream=stream, entry_id__in=gone[start : start + DLQ_PAGE]).delete()
    return len(gone)


def forget_dead_letters(stream):
    """No dead-letter stream in Redis (deleted, FLUSHALL, a restart without persistence, a key of
    another type, another Redis): Redis is the source of truth, so the stream has no dead letters."""
    from streams_app.models import DeadLetter

    DeadLetter.objects.filter(stream=stream.name).delete()
    if stream.dlq_cursor != "0-0":
        stream.dlq_cursor = "0-0"
        stream.save(update_fields=["dlq_cursor"])


# -- the whole mirror -------------------------------------------------------------------------

def sync_all(conn=None, now=None, dlq_limit=None):
    """Sync the streams mirror and the mirrors other apps registered (shoal_common.mirrors).

    Records the outcome in MirrorState: Redis errors are recorded and raised again; streams that
    could not be copied are recorded by name (the others are current).
    """
    from streams_app.models import MirrorState

    now = now or dj_timezone.now()
    state, _ = MirrorState.objects.get_or_create(name=STREAMS_MIRROR)
    state.attempted_at = now
    failures = {}
    try:
        sync_streams(conn=conn, now=now, dlq_limit=dlq_limit, failures=failures)
        sync_registered(now=now)  # other apps' mirrors (discovery_app's instances), registered in their ready()
    except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:
        state.error = f"{type(exc).__name__}: {exc}"
        state.save()
        raise
    state.synced_at = now
    state.error = ("; ".join(f"stream {name} was not copied ({error})" for name, error in failures.items())
                   + "; every other stream is current")[:2000] if failures else ""
    state.save()
    return state


def try_sync(conn=None):
    """Sync for a page that is opening: never fails the page; returns the MirrorState to show."""
    from streams_app.models import MirrorState

    try:
        return sync_all(conn=conn, dlq_limit=PAGE_DLQ_LIMIT)
    except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:
        logger.warning("Admin: could not sync the mirror from Redis (%s); showing the last copy", exc)
    except DatabaseError as exc:
        # Two syncs creating the same row at once (another page, the daemon): the other one wins.
        logger.warning("Admin: could not store the mirror (%s); showing the last copy", exc)
    except Exception:
        # Whatever else goes wrong in a copy, the page shows the last one rather than a 500.
        logger.exception("Admin: the mirror sync failed; showing the last copy")
    return MirrorState.objects.filter(name=STREAMS_MIRROR).first()
