"""Deferred delivery: ``publish(..., run_after=...)`` keeps a message out of its stream until it is due.

Per stream S (for a partitioned stream: the partition the message's key routes to), in S's cluster slot:

- ``{S}:scheduled``, a sorted set: scheduled id -> when the message is due (ms, on the Redis clock);
- ``{S}:scheduled:data``, a hash: scheduled id -> the entry's fields (a netstring list, maxlen first).

Scheduling is one script (lua/schedule.lua: a delay is added to the server's TIME there, so a
publisher with a skewed clock still defers by what it asked). Moving is one script too
(lua/move_due.lua): it compares the scores with the server's TIME, and for each due message XADDs
it to S and removes it from both keys in the same call. A script runs to the end once Redis has it,
whatever becomes of the client, so a mover SIGKILLed at any point has moved each message once or
not at all; several movers racing on a stream each move only what is still scheduled.

Who moves: every consumer process, for each stream it reads (``Mover``, called from the worker's
main thread once per pass), and the reclaim daemon every pass as a backstop (``move_all_due``).

The scheduled id (``new_ids``) is what a deferred ``publish`` returns: ``<ms>-<sequence>-<random>``,
unique across processes. The entry, once moved, carries it as ``shoal:scheduled_id`` and its due
time as ``shoal:run_after`` (ms). Ids sort in publish order within a process, which is how the
sorted set orders messages due in the same millisecond.
"""
import itertools
import logging
import math
import os
import time
from collections import namedtuple
from datetime import UTC, datetime, timedelta

import redis
from redis.exceptions import AskError, MovedError

from shoal_common.redis_errors import is_no_permission, is_oom, is_wrongtype
from shoal_common.text import to_text
from streams_app.redis import keys, scripts
from streams_app.conf import get_settings, setting
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection, is_cluster, per_slot, recover, slot_pipeline
from streams_app.exceptions import NotReplicatedError, PublishError
# On a moved entry; on a deferred outbox row RUN_AFTER_FIELD says when it will be due (the relay's cue).
from streams_app.publishing.message import RUN_AFTER_FIELD, SCHEDULED_ID_FIELD

# Its name from before the module moved to streams_app.publishing (issue 49): hosts' LOGGING names it.
logger = logging.getLogger("streams_app.scheduled")

# Fields one move script call copies at most, in bytes (a few 1 MiB payloads stay a short script).
MOVE_MAX_BYTES = 4 * 1024 * 1024
# Messages per schedule script call (publish_many): as many as one MULTI/EXEC of direct messages.
SCHEDULE_CHUNK = 1000
# The reclaim daemon moves at most this many batches per stream and pass (then the next pass goes on).
BACKSTOP_CALLS = 100

# A Redis user without sorted-set commands (an ACL from before deferred messages) cannot schedule or move.
ACL_HINT = ("the Redis user may not run the sorted-set commands deferred messages need: grant it +@sortedset "
            "(docs/operations.md, \"Redis ACL\")")
FORBIDDEN_RETRY = 60.0  # seconds between two tries of a mover whose user may not run them (the ACL may change)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

Due = namedtuple("Due", "mode ms")  # mode "in": ms from now on the Redis clock; "at": epoch ms


# -- what the caller asked for -------------------------------------------------------------------

def due_of(run_after):
    """The ``Due`` of a ``run_after``: an aware datetime, or a timedelta from now. PublishError for
    anything else, a naive datetime, a negative delay, or a time further ahead than RUN_AFTER_MAX."""
    bound = setting("RUN_AFTER_MAX")
    if isinstance(run_after, datetime):
        if run_after.utcoffset() is None:
            raise PublishError(f"run_after must be an aware datetime, not the naive {run_after.isoformat()}: a naive "
                               "time means a different instant on each host. Use django.utils.timezone.now() + "
                               "timedelta(...), datetime.now(UTC), or a timedelta; nothing was published")
        ahead = (run_after - datetime.now(UTC)).total_seconds()
        if ahead > bound:
            raise _too_far(ahead, bound)
        return Due("at", _ceil_ms(run_after - _EPOCH))
    if isinstance(run_after, timedelta):
        if run_after < timedelta(0):
            raise PublishError(f"run_after must not be a negative timedelta ({run_after!r}); use timedelta(0) or a "
                               "past datetime for 'as soon as possible'; nothing was published")
        if run_after.total_seconds() > bound:
            raise _too_far(run_after.total_seconds(), bound)
        return Due("in", _ceil_ms(run_after))
    raise PublishError(f"run_after must be an aware datetime or a timedelta, not {type(run_after).__name__} "
                       f"{run_after!r} (for seconds from now, pass timedelta(seconds=...)); nothing was published")


def _ceil_ms(delta):
    """Whole milliseconds, rounded up: a message is never due before the time asked for."""
    return -(-(delta // _MICROSECOND) // 1000)


def _too_far(seconds, bound):
    return PublishError(f"run_after is {seconds:,.0f} s ahead, beyond STREAMS['RUN_AFTER_MAX'] ({bound:,} s); a "
                        "message due that late is most likely a mistake (milliseconds taken for seconds). Raise "
                        "RUN_AFTER_MAX if you mean it; nothing was published")


def absolute(due):
    """``due`` as epoch ms by this process's clock: for the outbox, whose writer does not talk to Redis."""
    return due if due.mode == "at" else Due("at", math.ceil(time.time() * 1000) + due.ms)


_sequence = itertools.count()


def new_ids(count):
    """``count`` scheduled ids: ``<publish ms>-<sequence in this process>-<random>``. The random part is
    drawn per call (os.urandom, so forked processes differ), the sequence per id."""
    ms, token = int(time.time() * 1000), os.urandom(6).hex()
    return [f"{ms:013d}-{next(_sequence):012d}-{token}" for _ in range(count)]


def pack(fields, maxlen=None):
    """The fields of an entry and its maxlen as one netstring list (lua/move_due.lua unpacks it)."""
    parts = [b"" if maxlen is None else str(maxlen).encode()]
    for name, value in fields.items():
        parts += [_bytes(name), _bytes(value)]
    return b"".join(b"%d:%s" % (len(part), part) for part in parts)


def _bytes(value):
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


# -- scheduling ------------------------------------------------------------------------------------

def _script_keys(stream):
    return [stream, keys.scheduled_key(stream), keys.scheduled_data_key(stream)]


def schedule(conn, stream, items, mode, pipeline=None):
    """Queue one schedule script for ``items`` ((scheduled id, due ms, packed fields)) of ``stream``;
    ``mode`` "in" or "at" (see Due). Run at once without ``pipeline``: returns the script's reply
    (``check_reply`` reads it)."""
    args = [mode]
    for scheduled_id, due_ms, packed in items:
        args += [scheduled_id, due_ms, packed]
    return scripts.run(conn, "schedule", _script_keys(stream), args, pipeline=pipeline)


def check_reply(reply):
    """Raise the PublishError of a schedule reply that found a key of another type (nothing was stored)."""
    if int(reply[0]) < 0:
        key, kind = to_text(reply[1]), to_text(reply[2])
        raise PublishError(f"Redis key {key!r} holds a {kind}, not the {_WANTED.get(key.rsplit(':', 1)[-1], 'stream')} "
                           "Shoal keeps there; nothing was published and the key was left as it is. Publish to "
                           "another stream name, or remove the key yourself.")
    return int(reply[0])


_WANTED = {"scheduled": "sorted set of deferred messages", "data": "hash of deferred messages' fields"}


class Interrupted(Exception):
    """Redis failed part-way through a deferred publish: the producer turns it into a PartialPublishError
    (``ids``: the scheduled ids stored for sure, from the first message on; ``in_doubt``: how many after
    them may or may not have been) or, for a single message, into the Redis error ``cause``."""

    def __init__(self, ids, in_doubt, cause):
        super().__init__(str(cause))
        self.ids, self.in_doubt, self.cause = ids, in_doubt, cause


def _interrupted(ids, stored, sent, cause):
    """``Interrupted`` for messages ``stored`` (flags) when the script of positions ``sent`` was cut short
    (``sent`` empty: it was refused, nothing of it stored). Streams go in order of first appearance, so
    what is stored need not be a prefix: those after the stored prefix, up to the last one stored or
    sent, are in doubt."""
    known = 0
    while known < len(ids) and stored[known]:
        known += 1
    end = max([i for i, done in enumerate(stored) if done] + list(sent) + [known - 1]) + 1
    return Interrupted(ids[:known], max(0, end - known), cause)


def publish_deferred(conn, targets, encoded, maxlen, due, replicas=None, timeout_ms=1000):
    """Schedule the messages ``encoded`` (fields), message i on the stream ``targets[i]``; return their
    scheduled ids in order. One script per stream and SCHEDULE_CHUNK messages: each is stored whole or
    not at all. With ``replicas``, WAIT follows each stream's last script on the same connection.

    Raises PublishError (a key of another type, before anything of that stream is stored),
    NotReplicatedError, and ``Interrupted`` when Redis fails or refuses a script.
    """
    ids = new_ids(len(encoded))
    blobs = [pack(fields, maxlen) for fields in encoded]
    shares = {}  # stream -> positions, streams in order of first appearance
    for position, target in enumerate(targets):
        shares.setdefault(target, []).append(position)
    stored = [False] * len(encoded)
    short = []  # (positions, replicas confirmed) of streams whose WAIT fell short
    for target, positions in shares.items():
        chunks = [positions[i : i + SCHEDULE_CHUNK] for i in range(0, len(positions), SCHEDULE_CHUNK)]
        for number, chunk in enumerate(chunks):
            wait = (replicas, timeout_ms) if replicas is not None and number == len(chunks) - 1 else None
            try:
                confirmed = _schedule_chunk(conn, target, [(ids[i], due.ms, blobs[i]) for i in chunk], due.mode, wait)
            except TRANSIENT_ERRORS as exc:
                raise _interrupted(ids, stored, chunk, exc) from None  # cut short: the chunk is in doubt
            except (PublishError, redis.ResponseError) as exc:
                if isinstance(exc, PublishError) and not any(stored):
                    raise
                raise _interrupted(ids, stored, (), exc) from None  # refused: nothing of the chunk stored
            for i in chunk:
                stored[i] = True
            if wait is not None and confirmed < replicas:
                short.append((positions, confirmed))
    if short:
        fewest = min(confirmed for _, confirmed in short)
        unconfirmed = sorted(i for positions, _ in short for i in positions)
        raise NotReplicatedError(
            f"{len(unconfirmed)} of {len(ids)} deferred messages are scheduled on a master that had only {fewest} of "
            f"{replicas} replica(s) confirm within {timeout_ms} ms; a failover now could lose them (their indexes are "
            "in .unconfirmed, their scheduled ids in .ids)", id=ids[0] if len(ids) == 1 else None, replicas=fewest,
            ids=ids, unconfirmed=unconfirmed)
    return ids


def _schedule_chunk(conn, target, items, mode, wait):
    """One schedule script on the node of ``target`` (and WAIT ``wait`` = (replicas, timeout) after it);
    the replicas confirmed (None without ``wait``). A slot that moved (MOVED/ASK) or a master that became
    a replica refuses the script unrun: the slot map is refreshed and it is sent once more."""
    for attempt in (1, 2):
        pipe = slot_pipeline(conn, target)
        schedule(conn, target, items, mode, pipeline=pipe)
        if wait is not None:
            pipe.execute_command("WAIT", *wait)
        try:
            replies = pipe.execute(raise_on_error=False)
        except TRANSIENT_ERRORS:
            recover(conn)  # a node pipeline does not follow a failover by itself
            raise
        reply = replies[0]
        if isinstance(reply, (MovedError, AskError, redis.exceptions.ReadOnlyError)) and attempt == 1:
            recover(conn)
            continue
        if isinstance(reply, Exception):
            if isinstance(reply, TRANSIENT_ERRORS):
                recover(conn)
            if is_no_permission(reply):
                raise PublishError(f"{ACL_HINT}; nothing was published ({reply})")
            raise reply
        check_reply(reply)
        if wait is None:
            return None
        confirmed = replies[1]
        if isinstance(confirmed, Exception):
            recover(conn)  # -UNBLOCKED: the master became a replica in a failover
            return 0
        return int(confirmed)


def schedule_each(conn, items):
    """The outbox relay's deferred rows: ``items`` of (stream, fields with RUN_AFTER_FIELD and
    SCHEDULED_ID_FIELD, maxlen). Returns, per item, its scheduled id or the error Redis (or a key of
    another type) gave its stream; one script per stream. Connection errors are raised."""
    results = [None] * len(items)
    shares = {}
    for position, (stream, fields, maxlen) in enumerate(items):
        entry = {name: value for name, value in fields.items() if name not in (RUN_AFTER_FIELD, SCHEDULED_ID_FIELD)}
        shares.setdefault(stream, []).append(
            (position, (fields[SCHEDULED_ID_FIELD], int(fields[RUN_AFTER_FIELD]), pack(entry, maxlen))))
    for stream, share in shares.items():
        try:
            check_reply(schedule(conn, stream, [item for _, item in share], "at"))
            outcome = None
        except (PublishError, redis.ResponseError) as exc:
            if isinstance(exc, TRANSIENT_ERRORS):
                raise
            outcome = PublishError(f"{ACL_HINT} ({exc})") if is_no_permission(exc) else exc
        for position, item in share:
            results[position] = outcome if outcome is not None else item[0]
    return results


# -- moving --------------------------------------------------------------------------------------

Moved = namedtuple("Moved", "moved next_in_ms refusal dropped")  # next_in_ms: -1 none left, 0 due now


def move_due(conn, stream, batch=None, pipeline=None):
    """Move up to ``batch`` (STREAMS['SCHEDULED_BATCH']) due messages of ``stream`` onto it; a ``Moved``
    (None when queued on ``pipeline``: ``read_moved`` reads its reply)."""
    batch = setting("SCHEDULED_BATCH") if batch is None else batch
    reply = scripts.run(conn, "move_due", _script_keys(stream), [batch, MOVE_MAX_BYTES], pipeline=pipeline)
    return None if pipeline is not None else read_moved(reply)


def read_moved(reply):
    moved, next_in, refusal, dropped = reply
    return Moved(int(moved), int(next_in), to_text(refusal), int(dropped))


def move_all_due(conn, stream, calls=BACKSTOP_CALLS):
    """Move what is due on ``stream``, batch after batch (at most ``calls``); return (moved, last Moved)."""
    total, result = 0, None
    for _ in range(calls):
        result = move_due(conn, stream)
        total += result.moved
        if result.refusal or result.next_in_ms != 0:
            break
    return total, result


def wrong_types(conn, stream):
    """What a WRONGTYPE from the move script meant: the stream's keys that hold another type, named."""
    wanted = dict(zip(_script_keys(stream), ("stream", "zset", "hash")))
    kinds = {key: to_text(conn.type(key)) for key in wanted}
    wrong = [f"Redis key {key!r} holds a {kind}, not a {wanted[key]}" for key, kind in kinds.items()
             if kind not in (wanted[key], "none")]
    return "; ".join(wrong) or "a key of another type (WRONGTYPE)"


def count(conn, stream):
    """How many deferred messages ``stream`` holds (ZCARD; 0 for a key of another type)."""
    try:
        return int(conn.zcard(keys.scheduled_key(stream)))
    except redis.ResponseError:
        return 0


class Mover:
    """Moves the due messages of the streams a consumer process reads; ``tick()`` once per pass.

    Each stream is looked at once per SCHEDULED_POLL_INTERVAL, sooner when the head of its scheduled
    set falls due (the move script says when, in ms of the Redis clock, turned into this process's
    monotonic clock), and again at once while a call left more due. The streams due are moved in one
    round trip per Redis node. Errors never leave here: connection errors and refusals wait for the
    next interval (the read loops report outages), and a stream key of another type is logged once.
    """

    def __init__(self, streams, *, config=None, clock=time.monotonic, name="", conn=None, refused=None):
        config = config or get_settings()
        # A move refused at maxmemory goes to ``refused(what, problem)``: a consumer process passes its
        # refusal bookkeeping (consuming.refusals: said once per outage, counted in the metrics).
        self.refused = refused
        self.poll = config["SCHEDULED_POLL_INTERVAL"]
        self.batch = config["SCHEDULED_BATCH"]
        self.clock = clock
        self.name = name
        self._conn = conn
        self.due = {stream: 0.0 for stream in streams}  # stream -> when to look again (monotonic)
        self.moved = 0
        self._reported = {}  # stream -> the refusal last logged
        self.forbidden = False  # the Redis user may not run sorted-set commands (said once)
        self.looked = False  # every stream's script ran once: its keys' types and the ACL were checked

    @property
    def conn(self):
        return self._conn if self._conn is not None else get_connection()

    def wait(self, now=None, most=1.0):
        """Seconds until a stream is due to be looked at (at most ``most``)."""
        now = self.clock() if now is None else now
        return max(0.0, min([most, *(at - now for at in self.due.values())]))

    def tick(self, now=None):
        """Move what is due on the streams whose time has come; return how many messages moved."""
        now = self.clock() if now is None else now
        streams = [stream for stream, at in self.due.items() if now >= at]
        if not streams:
            return 0
        moved, conn = 0, None
        try:
            conn = self.conn  # the first lookup asks Redis whether it is a cluster
            if self.looked and not self.forbidden and not is_cluster(conn):  # forbidden: FORBIDDEN_RETRY paces it
                streams = self._holding(conn, streams, now)
            for pipe, node_streams in per_slot(conn, streams):
                for stream in node_streams:
                    move_due(conn, stream, self.batch, pipeline=pipe)
                for stream, reply in zip(node_streams, pipe.execute(raise_on_error=False)):
                    moved += self._after(stream, reply, now)
        except TRANSIENT_ERRORS:
            if conn is not None:
                recover(conn)  # scripts go to nodes directly: follow a failover
            for stream in streams:
                self.due[stream] = max(self.due[stream], now + self.poll)
        else:
            self.looked = True
        self.moved += moved
        return moved

    def _holding(self, conn, streams, now):
        """Those of ``streams`` that may hold deferred messages. On one server one EXISTS of all their
        scheduled sets answers for every stream: an idle process's pass is one command, not a script
        call (and its ZCARD) per stream, six of them per Tasks queue (sync and async, three bands).
        On a cluster the sets are in different slots, which one EXISTS cannot span."""
        try:
            if conn.exists(*(keys.scheduled_key(stream) for stream in streams)):
                return streams
        except redis.ResponseError:
            return streams  # a refused EXISTS (an ACL): the scripts meet the refusal and say it
        for stream in streams:
            self.due[stream] = now + self.poll
        return []

    def _after(self, stream, reply, now):
        if isinstance(reply, Exception):
            if isinstance(reply, TRANSIENT_ERRORS):
                raise reply
            if is_no_permission(reply):
                if not self.forbidden:
                    self.forbidden = True
                    logger.warning("Consumer %s: deferred messages are not moved: %s. Deferred publishes are refused "
                                   "alike, so none can be waiting unless the ACL changed.", self.name, ACL_HINT)
                self.due[stream] = now + FORBIDDEN_RETRY
                return 0
            problem = wrong_types(self.conn, stream) if is_wrongtype(reply) else f"{type(reply).__name__}: {reply}"
            self._report(stream, problem, oom=is_oom(reply))
            self.due[stream] = now + self.poll
            return 0
        result = read_moved(reply)
        if result.dropped:
            logger.warning("Consumer %s: dropped %d deferred messages of %s whose fields were missing from %s "
                           "(deleted by hand?)", self.name, result.dropped, stream, keys.scheduled_data_key(stream))
        if result.refusal:
            refusal = wrong_types(self.conn, stream) if result.refusal.startswith("WRONGTYPE") else result.refusal
            self._report(stream, refusal, oom=result.refusal.startswith("OOM"))
            self.due[stream] = now + self.poll
        else:
            self._reported.pop(stream, None)
            wait = self.poll if result.next_in_ms < 0 else min(self.poll, result.next_in_ms / 1000)
            self.due[stream] = now + wait
        if result.moved:
            logger.debug("Consumer %s: moved %d due deferred messages onto %s", self.name, result.moved, stream)
        return result.moved

    def _report(self, stream, problem, oom):
        if oom and self.refused is not None:
            self.refused("scheduled", problem)
            return
        if self._reported.get(stream) != problem:
            self._reported[stream] = problem
            logger.warning("Consumer %s: could not move due deferred messages onto %s (%s); they stay scheduled "
                           "in %s (Shoal leaves the keys as they are) and are tried again every %.0f s", self.name,
                           stream, problem, keys.scheduled_key(stream), self.poll)
