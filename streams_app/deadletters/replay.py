"""Putting dead letters back on their stream for the one group that failed them.

The replayed entry is a new entry of the origin stream with the original fields plus
``shoal:target_group`` (and ``shoal:replay_of``, the original id). Every Shoal loop checks
``shoal:target_group`` before decoding or running anything: loops of other groups ack such an
entry without calling their handler. The re-publish and the removal from the DLQ are one Lua
script. A replay to a group that does not exist on the stream is refused and removes nothing:
nobody would run the entries (every other group acks them unseen).
"""
from dataclasses import dataclass, field

import redis

from streams_app.redis import keys, scripts
from streams_app.partitioning import partitions
from streams_app.redis.connection import get_connection
from streams_app.deadletters.store import PACKED_FIELDS, DeadLetter, failed_by
from streams_app.publishing.message import decode_fields
from streams_app.exceptions import PublishError, ReplayError
from shoal_common.redis_errors import is_nogroup, is_wrongtype
from shoal_common.text import to_text
from streams_app.redis.entry_ids import is_entry_id
from streams_app.redis.keys import key_type
from streams_app.redis.lag import find_group, name_bytes, to_shown
from streams_app.redis.names import validate_stream_name
from streams_app.publishing.encoding import encode_payload

REPLAY_BATCH = 200

# Why a dead letter was skipped (ReplayResult.skipped), in words for the CLI and the admin.
SKIP_REASONS = {
    "missing": "not in the dead-letter stream",
    "other-group": "dead-lettered by another group",
    "too-wide": "too many fields to re-publish from a script (over 3,500, kept packed in shoal:fields); copy it "
                "with XADD yourself",
}


@dataclass
class ReplayResult:
    replayed: list = field(default_factory=list)  # (dead-letter id, new stream id); new id None on a dry run
    skipped: dict = field(default_factory=dict)  # dead-letter id -> why ('missing', 'other-group', 'too-wide')
    dry_run: bool = False


_text = to_text


class _Null:
    def __repr__(self):
        return "JSON_NULL"


# ``payload_override=None`` means "keep the original payload"; to replay with the payload null, pass this.
JSON_NULL = _Null()


def _override_text(payload_override):
    """(payload, payload_types) of the override, '' for none: encoded as ``publish`` does, types included."""
    if payload_override is None:
        return "", ""
    if payload_override is JSON_NULL:
        return "null", ""
    try:
        # The same rules as publish (MAX_PAYLOAD_BYTES included): a replayed entry is a new entry of the stream.
        body, types, _ = encode_payload(payload_override)
    except PublishError as exc:
        raise ReplayError(f"the payload override cannot be replayed: {exc}; nothing was replayed") from None
    return body, types or ""


def replay(stream, group, ids=None, all=False, payload_override=None, dry_run=False, progress=None, conn=None,
           counter=None, batch_done=None):
    """Replay dead letters of ``group`` (the given ``ids``, or ``all`` of them) onto ``stream``.

    ``payload_override`` (any value ``publish`` takes: datetimes, Decimals... keep their types)
    replaces the payload of every replayed entry; None keeps the original (its ``payload_types``
    too), ``JSON_NULL`` replaces it with null.
    ``progress(scanned, total)`` is called after each batch when ``all`` is set. ``counter``: a hash key in the stream's slot (keys.replay_job_key) whose
    ``replayed`` field the replay script increments with each batch, in the same step (not for a
    logical stream, whose partitions are in slots of their own).
    ``batch_done(stream, [(dead-letter id, new id)])`` is called after each batch that replayed
    something (not on a dry run), with the (partition) stream the letters were in: a background job
    audits each letter as its batch is done, not all at its end.
    """
    validate_stream_name(stream)
    if not isinstance(group, str) or not group:
        raise ReplayError("a group is needed: replay goes to one group only")
    if bool(ids) == bool(all):
        raise ReplayError("give either dead-letter ids or all=True")
    malformed = [i for i in ids or () if not is_entry_id(i)]
    if malformed:
        raise ReplayError(f"not dead-letter entry ids: {', '.join(map(repr, malformed))}; "
                          f"an id looks like 1700000000000-0 (see the admin or XRANGE {keys.dead_letter_key(stream)})")
    conn = conn or get_connection()
    if partitions.is_partitioned(stream):
        return _replay_partitions(conn, stream, group, ids, all, payload_override, dry_run, progress, batch_done)
    try:
        if _group_name(conn, stream, group) is None:
            conn.xlen(keys.dead_letter_key(stream))  # a dead-letter key of another type says so first
            raise ReplayError(_no_group_message(conn, stream, group))
        return _replay(conn, stream, group, ids, all, payload_override, dry_run, progress, counter, batch_done)
    except redis.ResponseError as exc:
        if is_nogroup(exc):  # destroyed between the check and a batch: that batch removed nothing
            raise ReplayError(_no_group_message(conn, stream, group)) from None
        if not is_wrongtype(exc):
            raise
        kinds = {k: key_type(conn, k) for k in (keys.stream_key(stream), keys.dead_letter_key(stream))}
        wrong = ", ".join(f"{k!r} holds a {kind}" for k, kind in kinds.items() if kind not in ("stream", "none"))
        raise ReplayError(f"cannot replay: {wrong}, not a stream. Nothing was replayed; Shoal leaves the key as it is.") from None


def _no_group_message(conn, stream, group):
    try:
        names = sorted(to_shown(g["name"]) for g in conn.xinfo_groups(keys.stream_key(stream)))
    except redis.ResponseError:
        names = []
    known = f"groups on {stream}: {', '.join(names)}" if names else f"{stream} has no groups"
    return (f"group {group!r} does not exist on stream {stream!r} ({known}). Nothing was replayed and no dead "
            f"letter was removed: a replayed entry would be acked unseen by every other group. Start the "
            f"group's consumer (it creates the group) and replay again.")

def _replay_partitions(conn, stream, group, ids, all, payload_override, dry_run, progress, batch_done=None):
    """A logical stream's dead letters: each partition's go back into that same partition.

    Each partition has its own dead-letter stream ({orders:3}:dlq), and a replayed entry is
    re-published where it failed, so per-key order stays within one partition.
    """
    merged = ReplayResult(dry_run=dry_run)
    reasons = {}
    for name in partitions.names(stream):
        part = _replay(conn, name, group, ids, all, payload_override, dry_run, progress, batch_done=batch_done)
        merged.replayed.extend(part.replayed)
        for entry_id, why in part.skipped.items():
            if why != "missing" or entry_id not in reasons:
                reasons[entry_id] = why
    done = {entry_id for entry_id, _ in merged.replayed}
    merged.skipped = {entry_id: why for entry_id, why in reasons.items() if entry_id not in done}
    return merged


def _group_name(conn, stream, group):
    """``group`` as the bytes Redis holds for it on ``stream`` (the admin names a group that is not UTF-8
    as it shows it, escaped); None when the stream has no such group or is gone."""
    try:
        info = find_group(conn.xinfo_groups(keys.stream_key(stream)), group)
    except redis.ResponseError as exc:
        if is_wrongtype(exc):
            raise
        return None  # no such key
    return None if info is None else info["name"]


def _replay(conn, stream, group, ids, all, payload_override, dry_run, progress, counter=None, batch_done=None):
    override = _override_text(payload_override)
    result = ReplayResult(dry_run=dry_run)
    # The real group, its bytes compared with each letter's and sent to the script: a name that is not
    # UTF-8 (another client's group) is never decoded, nor re-spelled with backslashes.
    group = name_bytes(_group_name(conn, stream, group) or group)
    if ids:
        ids = list(dict.fromkeys(ids))
        pipe = conn.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xrange(keys.dead_letter_key(stream), min=entry_id, max=entry_id)
        found = {_text(page[0][0]): page[0][1] for page in pipe.execute() if page}
        for entry_id in ids:
            raw = found.get(entry_id)
            if raw is None:
                result.skipped[entry_id] = "missing"
            elif name_bytes(failed_by(raw)) != group:
                result.skipped[entry_id] = "other-group"
            elif _too_wide(DeadLetter(entry_id, decode_fields(raw))):
                result.skipped[entry_id] = "too-wide"  # what the script would answer: a dry run says it too
        chosen = [i for i in ids if i not in result.skipped]
        _replay_batch(conn, stream, group, chosen, override, dry_run, result, counter, batch_done)
        return result
    total = conn.xlen(keys.dead_letter_key(stream))
    # Only what is dead now: a replayed entry that fails again is dead-lettered anew above this
    # bound, and must not be replayed again by the same call (nor keep it running forever).
    newest = conn.xrevrange(keys.dead_letter_key(stream), count=1)
    if not newest:
        return result
    last = _text(newest[0][0])
    scanned = 0
    cursor = "-"
    while True:
        page = conn.xrange(keys.dead_letter_key(stream), min=cursor, max=last, count=REPLAY_BATCH)
        if not page:
            break
        scanned += len(page)
        cursor = "(" + _text(page[-1][0])
        mine = [DeadLetter(_text(i), decode_fields(f)) for i, f in page if name_bytes(failed_by(f)) == group]
        result.skipped.update((letter.id, "too-wide") for letter in mine if _too_wide(letter))
        _replay_batch(conn, stream, group, [letter.id for letter in mine if not _too_wide(letter)], override, dry_run,
                      result, counter, batch_done)
        if progress is not None:
            progress(scanned, max(total, scanned))
    return result


def _too_wide(letter):
    return PACKED_FIELDS in letter.fields


def _replay_batch(conn, stream, group, ids, override, dry_run, result, counter=None, batch_done=None):
    if not ids:
        return
    if dry_run:
        result.replayed.extend((i, None) for i in ids)
        return
    body, types = override
    script_keys = [keys.stream_key(stream), keys.dead_letter_key(stream), *([counter] if counter else [])]
    reply = scripts.run(conn, "replay", script_keys, [group, body, types, *ids])
    done = []
    for entry_id, outcome in zip(ids, map(_text, reply)):
        if outcome in ("missing", "other-group", "too-wide"):
            result.skipped[entry_id] = outcome  # deleted or replayed by someone else meanwhile, or too wide
        else:
            done.append((entry_id, outcome))
    result.replayed.extend(done)
    if batch_done is not None and done:
        batch_done(stream, done)
