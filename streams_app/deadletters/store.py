"""The dead-letter stream ``{S}:dlq``: moving failed entries there atomically, reading and deleting them.

A dead-letter entry keeps every field of the original entry and adds ``origin_stream``,
``origin_id``, ``group``, ``consumer``, ``deliveries``, ``error``, ``traceback`` and ``failed_at``
(ms). The move (XADD to the DLQ + XACK in the group) is one Lua script that first checks that the
entry is still pending in the group, so a crash loses nothing and racing movers (workers, several
reclaim daemons) dead-letter an entry exactly once.
"""
import logging
import time
import traceback as tb_module
from dataclasses import dataclass

from shoal_common.text import to_text
from streams_app import keys, scripts
from streams_app.connection import get_connection
from streams_app.consuming.outcomes import exception_text
from streams_app.message import decode_fields

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
METADATA_FIELDS = ("origin_stream", "origin_id", "group", "consumer", "deliveries", "error", "traceback", "failed_at")


def describe(exc, poison=False):
    """(error, traceback) of an exception, bounded; never raises. Poison input is ``decode: <reason>``."""
    if poison:
        return f"{DECODE_ERROR}: {exc}"[:MAX_ERROR_CHARS], ""
    error = exception_text(exc)[:MAX_ERROR_CHARS]
    lines = tb_module.format_exception(type(exc), exc, exc.__traceback__, limit=-TRACEBACK_FRAMES)
    return error, "".join(lines)[-MAX_TRACEBACK_CHARS:]


def record_errors(conn, stream, group, consumer, failures, ttl, pipeline=None):
    """Remember the last error of each (id, error, traceback), for ``ttl`` seconds."""
    pipe = pipeline if pipeline is not None else conn.pipeline(transaction=False)
    at = str(int(time.time() * 1000))
    for entry_id, error, traceback in failures:
        key = keys.error_key(stream, group, entry_id)
        pipe.hset(key, mapping={"error": error, "traceback": traceback, "consumer": consumer, "at": at})
        pipe.expire(key, ttl)
    if pipeline is None:
        pipe.execute()


def last_error(conn, stream, group, entry_id):
    """The recorded last error of a pending entry as a dict, or {}."""
    return decode_fields(conn.hgetall(keys.error_key(stream, group, entry_id)))


def move(conn, stream, group, failures, pipeline=None):
    """Dead-letter (id, error, traceback) triples of ``group``; error RECORDED_ERROR uses the recorded last error.

    Returns one result per entry (dead-letter id, 0 when no longer pending, 'gone' when deleted
    from the stream), or None when queued on ``pipeline``.
    """
    failures = list(failures)
    results = []
    failed_at = str(int(time.time() * 1000))
    for start in range(0, len(failures), MOVE_BATCH):
        batch = failures[start : start + MOVE_BATCH]
        script_keys = [keys.stream_key(stream), keys.dead_letter_key(stream)]
        script_keys += [keys.error_key(stream, group, entry_id) for entry_id, _, _ in batch]
        args = [group, failed_at]
        for entry_id, error, traceback in batch:
            args += [entry_id, error or "", traceback or ""]
        reply = scripts.run(conn, "dead_letter", script_keys, args, pipeline=pipeline)
        if pipeline is None:
            results.extend(_text(r) for r in reply)
    return None if pipeline is not None else results


_text = to_text


@dataclass(frozen=True)
class DeadLetter:
    id: str
    fields: dict  # every field as text, the metadata included

    @property
    def group(self):
        return self.fields.get("group", "")

    @property
    def origin_id(self):
        return self.fields.get("origin_id", "")

    @property
    def error(self):
        return self.fields.get("error", "")

    @property
    def deliveries(self):
        value = self.fields.get("deliveries", "")
        return int(value) if value.isdigit() else None

    @property
    def failed_at(self):
        value = self.fields.get("failed_at", "")
        return int(value) if value.isdigit() else None

    @property
    def original_fields(self):
        return {k: v for k, v in self.fields.items() if k not in METADATA_FIELDS}


def _dead_letter(entry_id, fields):
    return DeadLetter(_text(entry_id), decode_fields(fields))


def dead_letters(stream, start="-", count=100, group=None, conn=None):
    """Up to ``count`` dead letters of ``stream`` from id ``start`` on (oldest first), of ``group`` if given."""
    conn = conn or get_connection()
    found = []
    cursor = start
    while len(found) < count:
        page = conn.xrange(keys.dead_letter_key(stream), min=cursor, max="+", count=max(count, 100))
        found.extend(d for d in (_dead_letter(i, f) for i, f in page) if group is None or d.group == group)
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
    return [_dead_letter(*page[0]) for page in pipe.execute() if page]


def dead_letter_count(stream, conn=None):
    return (conn or get_connection()).xlen(keys.dead_letter_key(stream))


def delete_dead_letters(stream, ids, conn=None):
    """Delete dead letters by id; return how many existed."""
    ids = list(ids)
    if not ids:
        return 0
    return (conn or get_connection()).xdel(keys.dead_letter_key(stream), *ids)
