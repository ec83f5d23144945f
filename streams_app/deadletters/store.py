"""The dead-letter stream ``{S}:dlq``: moving failed entries there atomically, reading and deleting them.

A dead-letter entry keeps every field of the original entry as it was and adds Shoal's metadata
under reserved, namespaced names (``RESERVED_FIELDS``): ``shoal:origin_stream``,
``shoal:origin_id``, ``shoal:group``, ``shoal:consumer``, ``shoal:deliveries``, ``shoal:error``,
``shoal:traceback`` and ``shoal:failed_at`` (ms). An entry with thousands of fields keeps them as one
value, ``shoal:fields`` (see dead_letter.lua). The move (XADD to the DLQ + XACK in the group) is one
Lua script that first checks that the entry is still pending in the group, so a crash loses
nothing and racing movers (workers, several reclaim daemons) dead-letter an entry exactly once.
``move`` is the only caller of that script and the only reader of its replies.
"""
import logging
import time
import traceback as tb_module
from dataclasses import dataclass, field

import redis

from shoal_common.redis_errors import is_nogroup, is_wrongtype
from shoal_common.text import safe_text, to_text
from streams_app.redis import keys, scripts
from streams_app.redis.connection import get_connection, slot_pipeline
from streams_app.consuming.outcomes import exception_text
from streams_app.publishing.message import decode_fields

logger = logging.getLogger("streams_app.deadletters")

MAX_ERROR_CHARS = 1000
MAX_TRACEBACK_CHARS = 4000
TRACEBACK_FRAMES = 8
DECODE_ERROR = "decode"
# Entries per script call: keeps one script run short, so it does not stall other clients.
MOVE_BATCH = 100
# As the error of a move(): "use the last error the failing worker recorded for this entry" (the
# reclaim daemon and takeovers move entries whose handler failed in another process).
RECORDED_ERROR = None
# Field names Shoal reserves on stream and dead-letter entries (docs/failures.md "Reserved fields").
PREFIX = "shoal:"
METADATA_FIELDS = tuple(PREFIX + name for name in (
    "origin_stream", "origin_id", "group", "consumer", "deliveries", "error", "traceback", "failed_at"))
PACKED_FIELDS = PREFIX + "fields"  # the original fields of a very wide entry, as one netstring list
TARGET_GROUP = PREFIX + "target_group"  # on a replayed entry: the only group that handles it
REPLAY_OF = PREFIX + "replay_of"  # on a replayed entry: the dead-letter's original entry id
RESERVED_FIELDS = (*METADATA_FIELDS, PACKED_FIELDS, TARGET_GROUP, REPLAY_OF)


def describe(exc, poison=False):
    """(error, traceback) of an exception, bounded; never raises. Poison input is ``decode: <reason>``."""
    if poison:
        return safe_text(f"{DECODE_ERROR}: {exc}")[:MAX_ERROR_CHARS], ""
    error = exception_text(exc)[:MAX_ERROR_CHARS]
    try:
        lines = tb_module.format_exception(type(exc), exc, exc.__traceback__, limit=-TRACEBACK_FRAMES)
    except BaseException:  # noqa: BLE001 -- a chained exception's __str__ may raise too
        lines = []
    return error, safe_text("".join(lines))[-MAX_TRACEBACK_CHARS:]


def record_errors(conn, stream, group, consumer, failures, ttl, pipeline=None):
    """Remember the last error of each (id, error, traceback), for ``ttl`` seconds."""
    pipe = pipeline if pipeline is not None else conn.pipeline(transaction=False)
    at = str(int(time.time() * 1000))
    for entry_id, error, traceback in failures:
        key = keys.error_key(stream, group, entry_id)
        # Every writer of error text comes through here or move(): made safe once for all (safe_text).
        pipe.hset(key, mapping={"error": safe_text(error), "traceback": safe_text(traceback),
                                "consumer": safe_text(consumer), "at": at})
        pipe.expire(key, ttl)
    if pipeline is None:
        pipe.execute()


def last_error(conn, stream, group, entry_id):
    """The recorded last error of a pending entry as a dict, or {}."""
    return decode_fields(conn.hgetall(keys.error_key(stream, group, entry_id)))


@dataclass
class MoveResult:
    """What became of each entry handed to ``move``."""

    moved: list = field(default_factory=list)  # (entry id, dead-letter id)
    not_pending: list = field(default_factory=list)  # acked or moved by someone else first
    gone: list = field(default_factory=list)  # deleted from the stream: acked, nothing to move
    refused: list = field(default_factory=list)  # (entry id, why): still pending, untouched (e.g. maxmemory)

    def __len__(self):
        return len(self.moved)

    @property
    def dead_letter_ids(self):
        return [dead_id for _, dead_id in self.moved]

    def merge(self, other):
        for name in ("moved", "not_pending", "gone", "refused"):
            getattr(self, name).extend(getattr(other, name))
        return self


@dataclass
class QueuedMoves:
    """Moves queued on a caller's pipeline; ``result(replies)`` picks and decodes their replies.

    ``replies`` is the whole list ``pipeline.execute(raise_on_error=False)`` returned: this object
    remembers which of them are its own, so callers never count positions in a shared pipeline.
    """

    batches: list  # (reply index in the pipeline, [entry ids])

    def result(self, replies):
        result = MoveResult()
        for index, ids in self.batches:
            result.merge(_decode(ids, replies[index]))
        return result


def move(conn, stream, group, failures, pipeline=None):
    """Dead-letter (id, error, traceback) triples of ``group``; error RECORDED_ERROR uses the recorded last error.

    Without ``pipeline``: runs now and returns a MoveResult. With one: queues the scripts and
    returns QueuedMoves, whose ``result(pipeline.execute(raise_on_error=False))`` is the MoveResult.
    A move Redis refuses (maxmemory) is reported in ``refused`` and never stops the others.
    The group or stream being gone (NOGROUP) or of another type (WRONGTYPE) is raised.
    """
    failures = list(failures)
    # A plain pipeline on the stream's node: a cluster pipeline refuses scripts (every key here is in one slot).
    pipe = pipeline if pipeline is not None else slot_pipeline(conn, keys.stream_key(stream))
    queued = QueuedMoves([])
    failed_at = str(int(time.time() * 1000))
    for start in range(0, len(failures), MOVE_BATCH):
        batch = failures[start : start + MOVE_BATCH]
        script_keys = [keys.stream_key(stream), keys.dead_letter_key(stream)]
        script_keys += [keys.error_key(stream, group, entry_id) for entry_id, _, _ in batch]
        args = [group, failed_at]
        for entry_id, error, traceback in batch:
            args += [entry_id, safe_text(error or ""), safe_text(traceback or "")]
        queued.batches.append((len(pipe.command_stack), [entry_id for entry_id, _, _ in batch]))
        scripts.run(conn, "dead_letter", script_keys, args, pipeline=pipe)
    if pipeline is not None:
        return queued
    if not failures:
        return MoveResult()
    return queued.result(pipe.execute(raise_on_error=False))


def _decode(ids, reply):
    result = MoveResult()
    if isinstance(reply, Exception):
        if not isinstance(reply, redis.ResponseError) or is_nogroup(reply) or is_wrongtype(reply):
            raise reply
        # The whole script was refused (e.g. it could not be loaded at maxmemory): nothing moved.
        result.refused.extend((entry_id, str(reply)) for entry_id in ids)
        return result
    for entry_id, outcome in zip(ids, reply):
        outcome = _text(outcome)
        if outcome == 0:
            result.not_pending.append(entry_id)
        elif outcome == "gone":
            result.gone.append(entry_id)
        elif outcome.startswith("failed:"):
            result.refused.append((entry_id, outcome[len("failed:"):]))
        else:
            result.moved.append((entry_id, outcome))
    return result


_text = to_text


def unpack_fields(packed):
    """The original fields kept as one netstring list (``shoal:fields``), as text."""
    data = packed.encode() if isinstance(packed, str) else packed
    values = []
    at = 0
    while at < len(data):
        colon = data.index(b":", at)
        length = int(data[at:colon])
        values.append(data[colon + 1 : colon + 1 + length].decode("utf-8", "replace"))
        at = colon + 1 + length
    return dict(zip(values[::2], values[1::2]))


def failed_by(fields):
    """The group that failed a dead letter, as the bytes Redis holds (``fields`` as Redis returned them):
    compared as bytes, a group name that is not UTF-8 is neither decoded nor mistaken for another."""
    def field(name):
        value = fields.get(name.encode())
        return fields.get(name) if value is None else value

    if field(PREFIX + "origin_id") is None and field("origin_id") is not None:
        return field("group")  # written before Shoal namespaced its fields
    return field(PREFIX + "group")


@dataclass(frozen=True)
class DeadLetter:
    id: str
    fields: dict  # every field as text, the metadata included

    @property
    def legacy(self):
        """Written before Shoal namespaced its fields: metadata under the bare names (origin_id, group, ...)."""
        return PREFIX + "origin_id" not in self.fields and "origin_id" in self.fields

    def meta(self, name):
        """Metadata field ``name`` (e.g. "group"), '' if absent."""
        return self.fields.get(name if self.legacy else PREFIX + name, "")

    @property
    def group(self):
        return self.meta("group")

    @property
    def origin_id(self):
        return self.meta("origin_id")

    @property
    def consumer(self):
        return self.meta("consumer")

    @property
    def error(self):
        return self.meta("error")

    @property
    def traceback(self):
        return self.meta("traceback")

    @property
    def deliveries(self):
        value = self.meta("deliveries")
        return int(value) if value.isdigit() else None

    @property
    def failed_at(self):
        value = self.meta("failed_at")
        return int(value) if value.isdigit() else None

    @property
    def original_fields(self):
        """The entry's fields as they were on the stream (unpacked if they were stored as one value)."""
        if self.legacy:
            bare = {name[len(PREFIX):] for name in METADATA_FIELDS}
            return {k: v for k, v in self.fields.items() if k not in bare}
        original = {k: v for k, v in self.fields.items() if k not in METADATA_FIELDS and k != PACKED_FIELDS}
        packed = self.fields.get(PACKED_FIELDS)
        if packed is not None:
            original.update(unpack_fields(packed))
        return original


def parse_dead_letter(entry_id, fields):
    packed = fields.get(PACKED_FIELDS.encode(), fields.get(PACKED_FIELDS))
    decoded = decode_fields(fields)
    if packed is not None:
        decoded[PACKED_FIELDS] = packed  # netstring lengths count bytes: keep the raw value for unpacking
    return DeadLetter(_text(entry_id), decoded)


def dead_letters(stream, start="-", count=100, group=None, conn=None):
    """Up to ``count`` dead letters of ``stream`` from id ``start`` on (oldest first), of ``group`` if given."""
    conn = conn or get_connection()
    found = []
    cursor = start
    while len(found) < count:
        page = conn.xrange(keys.dead_letter_key(stream), min=cursor, max="+", count=max(count, 100))
        found.extend(d for d in (parse_dead_letter(i, f) for i, f in page) if group is None or d.group == group)
        if len(page) < max(count, 100):
            break
        cursor = "(" + _text(page[-1][0])
    return found[:count]


def get_dead_letters(stream, ids, conn=None):
    """The dead letters with these ids (ids not in the DLQ are left out)."""
    conn = conn or get_connection()
    pipe = conn.pipeline(transaction=False)
    for entry_id in ids:
        pipe.xrange(keys.dead_letter_key(stream), min=entry_id, max=entry_id)
    return [parse_dead_letter(*page[0]) for page in pipe.execute() if page]


def dead_letter_count(stream, conn=None):
    return (conn or get_connection()).xlen(keys.dead_letter_key(stream))


def delete_dead_letters(stream, ids, conn=None):
    """Delete dead letters by id; return how many existed."""
    ids = list(ids)
    if not ids:
        return 0
    return (conn or get_connection()).xdel(keys.dead_letter_key(stream), *ids)
