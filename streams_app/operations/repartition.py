"""Change a stream's partition count online, keeping per-key order (``manage.py repartition STREAM N``).

The phases (docs/cluster.md, "Repartitioning online"), each idempotent, so a run stopped or killed
anywhere is finished by running it again:

1. **prepare**: every group of the current partitions is created on each new partition at id 0, so
   nothing published there is skipped by a group whose consumers have not switched yet;
2. **switch**: the new epoch is written to ``{S}:layout`` (state ``migrating``): publishers route to
   the new partitions within a second, consumers read both epochs;
3. **seal**: after SWITCH_SECONDS (every process re-read the layout), state ``sealed``: the previous
   partitions get no new messages, and an ordered partition of the new epoch starts once its feeders
   are drained for its group (streams_app.consuming.gate);
4. **deferred**: messages waiting in the previous partitions' scheduled sets move to the partition
   their key routes to now;
5. **drain**: wait until every group has handled everything of the previous partitions;
6. **retire**: their dead letters move to the partitions their keys route to now; state ``stable``; the
   previous names join ``retired`` and consumers stop reading them (the streams stay, acknowledged).

One run at a time per stream: ``{S}:repartition:lock`` (SET NX with a TTL, renewed while it runs).
"""
import json
import os
import socket
import time

from shoal_common.text import to_text
from streams_app import registry
from streams_app.partitioning import drain, layout, partitions
from streams_app.redis import keys
from streams_app.publishing import scheduled
from streams_app.consuming.groups import ensure_group
from streams_app.exceptions import StreamsError
from streams_app.redis.names import validate_stream_name

LOCK_TTL_MS = 15_000
MOST_PARTITIONS = 1024
POLL_SECONDS = 0.5


class RepartitionError(StreamsError):
    """The repartition cannot start or go on (another one runs, a bad count, an unfinished other change)."""


def lock_key(stream):
    return f"{keys.hash_tag(stream)}:repartition:lock"


_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lock:
    def __init__(self, conn, stream):
        self.conn, self.key = conn, lock_key(stream)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"

    def acquire(self):
        if self.conn.set(self.key, self.token, nx=True, px=LOCK_TTL_MS):
            return
        holder, ttl = to_text(self.conn.get(self.key) or ""), self.conn.pttl(self.key)
        raise RepartitionError(
            f"another repartition of this stream is running (lock {self.key} held by {holder or '?'}, "
            f"{max(ttl, 0) / 1000:.1f}s left on it). Wait for it to finish; if it was killed, the lock lapses "
            f"within {LOCK_TTL_MS // 1000}s and running the command again finishes the job.")

    def renew(self):
        if not int(self.conn.eval(_RENEW, 1, self.key, self.token, LOCK_TTL_MS)):
            raise RepartitionError(f"lost the lock {self.key} (paused past {LOCK_TTL_MS // 1000}s?): another run "
                                   "may have taken over; run the command again to see where it stands.")

    def release(self):
        self.conn.eval(_RELEASE, 1, self.key, self.token)


def current_layout(conn, stream):
    """The live layout, or epoch 0 made from what publishers use today (``{S}:partitions``, else the setting)."""
    live = layout.read(conn, stream)
    if live is not None:
        return live
    raw = conn.get(partitions.record_key(stream))
    names = json.loads(raw) if raw else partitions.names(stream, n=partitions.count(stream))
    return layout.Layout(stream, {"epoch": 0, "names": names, "state": layout.STABLE})


def _write(conn, stream, record):
    conn.set(layout.layout_key(stream), json.dumps(record, sort_keys=True))
    conn.set(partitions.record_key(stream), json.dumps(record["names"]))
    layout.forget()


def _redis_ms(conn):
    seconds, micros = conn.time()
    return int(seconds) * 1000 + int(micros) // 1000


def repartition(stream, n, *, conn=None, say=print, wait=True, clock=time.monotonic, sleep=time.sleep):
    """Bring ``stream`` to ``n`` partitions while it is used; ``say(text)`` reports each phase.

    Returns the final Layout. ``wait=False`` stops after the seal (the drain is left to a later run).
    Raises RepartitionError for what the caller must fix first."""
    from streams_app.redis.connection import get_connection

    conn = conn or get_connection()
    if not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= MOST_PARTITIONS:
        raise RepartitionError(f"the partition count must be an integer from 2 to {MOST_PARTITIONS}, not {n!r}. "
                               "To stop partitioning a stream, migrate to a new stream name (docs/cluster.md).")
    validate_stream_name(stream)  # braces would break the slot of every key: refused before anything is written
    lock = Lock(conn, stream)
    lock.acquire()
    try:
        return _run(conn, stream, n, lock, say, wait, clock, sleep)
    finally:
        lock.release()


def _run(conn, stream, n, lock, say, wait, clock, sleep):
    live = current_layout(conn, stream)
    if live.moving and len(live.names) != n:
        raise RepartitionError(
            f"stream {stream!r} is being repartitioned from {len(live.previous)} to {len(live.names)} partitions "
            f"(epoch {live.epoch}, {live.state}); finish that first: manage.py repartition {stream} {len(live.names)}")
    if not live.moving:
        if len(live.names) == n:
            say(f"{stream}: already {n} partitions (epoch {live.epoch}); nothing to do")
            return live
        live = _prepare_and_switch(conn, stream, n, live, say, lock)
    else:
        say(f"{stream}: resuming the change from {len(live.previous)} to {n} partitions (epoch {live.epoch}, {live.state})")
    lock.renew()
    if live.state == layout.MIGRATING:
        live = _seal(conn, stream, live, lock, say, clock, sleep)
    if not wait:
        say(f"{stream}: sealed; run again to drain and retire the previous partitions")
        return live
    _move_deferred(conn, stream, live, say, lock)
    _drain(conn, stream, live, lock, say, clock, sleep)
    _move_deferred(conn, stream, live, say, lock)  # scheduled there during the drain by a publisher late to switch
    letters = sum(move_dead_letters(conn, stream, old, renew=lock.renew) for old in live.previous)
    if letters:
        say(f"{stream}: dead letters: moved {letters} to the partitions their keys route to now (replay puts them there)")
    record = {**live.record, "state": layout.STABLE, "previous": [],
              "retired": [p for p in live.retired + live.previous if p not in live.names],
              "finished_ms": _redis_ms(conn)}
    _write(conn, stream, record)
    say(f"{stream}: retire: done, {n} partitions (epoch {live.epoch}): {', '.join(live.names)}")
    return layout.Layout(stream, record)


def _prepare_and_switch(conn, stream, n, live, say, lock):
    epoch = live.epoch + 1
    new = partitions.names(stream, n=n, epoch=epoch)
    # The groups of this project's consumers too, on the current partitions at their own start: a group
    # whose consumers never ran yet reads the entries published before the change (start "0"), and
    # the drain waits for it, instead of retiring partitions no group has read.
    declared = {spec.group: spec.start for spec in registry.declared(stream)}
    for name in live.names:
        for group, start in declared.items():
            ensure_group(conn, name, group, start)
        lock.renew()  # many partitions and groups on a slow cluster may take longer than the lock's TTL
    groups = sorted({g for p in live.names for g in drain.groups(conn, p)} | set(declared))
    say(f"{stream}: prepare: {len(live.names)} -> {n} partitions (epoch {epoch}); "
        f"creating {len(groups)} group(s) on the new partitions: {', '.join(groups) or '(none yet)'}")
    for name in new:
        for group in groups:
            ensure_group(conn, name, group, "0")
        lock.renew()
    record = {"epoch": epoch, "names": new, "state": layout.MIGRATING, "previous": list(live.names),
              "retired": list(live.retired), "started_ms": _redis_ms(conn)}
    _write(conn, stream, record)
    say(f"{stream}: switch: publishers now route to {', '.join(new)}")
    return layout.Layout(stream, record)


def _seal(conn, stream, live, lock, say, clock, sleep):
    switch_ms = int(layout.SWITCH_SECONDS * 1000)
    while True:
        waited = _redis_ms(conn) - int(live.record.get("started_ms", 0))
        if waited >= switch_ms:
            break
        say(f"{stream}: seal: waiting {(switch_ms - waited) / 1000:.1f}s for every process to follow the new layout")
        lock.renew()
        sleep(min(POLL_SECONDS * 2, (switch_ms - waited) / 1000))
    record = {**live.record, "state": layout.SEALED, "sealed_ms": _redis_ms(conn)}
    _write(conn, stream, record)
    say(f"{stream}: seal: the previous partitions get no new messages; ordered partitions start as their feeders drain")
    return layout.Layout(stream, record)


def _move_deferred(conn, stream, live, say, lock):
    moved = 0
    for old in live.previous:
        moved += move_scheduled(conn, stream, old, renew=lock.renew)
    if moved:
        say(f"{stream}: deferred: moved {moved} waiting message(s) to the partitions their keys route to now")


def move_scheduled(conn, stream, old, renew=None, batch=500):
    """Move the deferred messages of partition ``old`` to the new partition of their key; return how many.

    Written to the new partition's scheduled set (same scheduled id, same due time) before it is removed
    from the old one: a run killed in between moves it again on the next run, never loses it (a mover
    may have delivered the first copy meanwhile: at least once)."""
    zset, data = keys.scheduled_key(old), keys.scheduled_data_key(old)
    moved = 0
    while True:
        page = conn.zrange(zset, 0, batch - 1, withscores=True)  # each one moved is removed: the next page
        if not page:
            return moved
        moved += _move_page(conn, stream, zset, data, page)
        if renew is not None:
            renew()


def _move_page(conn, stream, zset, data, page):
    moved = 0
    for member, score in page:
        member = to_text(member)
        packed = conn.hget(data, member)
        if packed is None:
            conn.zrem(zset, member)
            continue
        key = _unpack_key(packed)
        target = partitions.route(stream, key)
        scheduled.check_reply(scheduled.schedule(conn, target, [(member, int(score), packed)], "at"))
        conn.zrem(zset, member)
        conn.hdel(data, member)
        moved += 1
    return moved


def move_dead_letters(conn, stream, old, batch=500, renew=None):
    """Move the dead letters of partition ``old`` to the dead-letter stream of their key's partition now.

    So the admin, the dead-letter metric and ``replay`` (which puts a letter back where it lies) find them
    in the live layout. Each is added there before it is deleted here: killed in between, a letter shows
    twice, never goes missing."""
    source = keys.dead_letter_key(old)
    moved = 0
    while True:
        page = conn.xrange(source, count=batch)
        if not page:
            return moved
        for entry_id, fields in page:
            key = fields.get(b"key", fields.get("key"))
            target = partitions.route(stream, to_text(key) if key is not None else None)
            conn.xadd(keys.dead_letter_key(target), fields)
            conn.xdel(source, entry_id)
            moved += 1
        if renew is not None:
            renew()


def _unpack_key(packed):
    """The message key in a packed deferred entry (netstrings: maxlen, then field, value, ...)."""
    parts, at = [], 0
    packed = packed if isinstance(packed, bytes) else packed.encode()
    while at < len(packed):
        colon = packed.index(b":", at)
        size = int(packed[at:colon])
        parts.append(packed[colon + 1:colon + 1 + size])
        at = colon + 1 + size
    fields = dict(zip(parts[1::2], parts[2::2]))
    value = fields.get(b"key")  # the field encode_message writes a message's key under
    return value.decode() if value is not None else None


def _drain(conn, stream, live, lock, say, clock, sleep):
    last_said = None
    unread = {old: conn.xlen(old) for old in live.previous if conn.exists(old) and not drain.groups(conn, old)}
    if any(unread.values()):
        say(f"{stream}: drain: no group reads {', '.join(o for o, c in unread.items() if c)}; their "
            f"{sum(unread.values())} entries stay there, unread (declare the consumer, or read them yourself)")
    while True:
        left = {old: drain.left(conn, old) for old in live.previous}
        total = sum(sum(groups.values()) for groups in left.values())
        if total == 0:
            say(f"{stream}: drain: the {len(live.previous)} previous partitions are drained")
            return
        now = clock()
        if last_said is None or now - last_said >= 2.0:
            busy = ", ".join(f"{old}/{g}: {c}" for old, groups in left.items() for g, c in groups.items() if c)
            say(f"{stream}: drain: {total} entries left to handle in the previous partitions ({busy})")
            last_said = now
        lock.renew()
        sleep(POLL_SECONDS)
