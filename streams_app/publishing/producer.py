"""Publishing JSON messages to a stream."""
from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import AskError, MovedError

from streams_app import tracing
from streams_app.partitioning import partitions
from streams_app.publishing import scheduled
from shoal_common.redis_errors import is_wrongtype
from shoal_common.text import to_text
from streams_app.redis.connection import (
    TRANSIENT_ERRORS, get_connection, is_cluster, node_client, recover, slot_pipeline,
)
from streams_app.exceptions import NotReplicatedError, PartialPublishError, PublishError
from streams_app.redis.keys import key_type
from streams_app.publishing.encoding import Fields, encode_message, encode_payload, message_encoder
from streams_app.publishing.message import IDEMPOTENCY_ID_FIELD
from streams_app.redis.names import validate_stream_name

__all__ = ["publish", "publish_many", "encode_message", "encode_payload", "message_encoder", "set_publish_hook",
           "diverted"]  # the encoders live in streams_app.publishing.encoding; their old home still names them

_PIPELINE_CHUNK = 1000
# hook(stream, entries, using) -> entry ids (see set_publish_hook)
PublishHook = Callable[[str, list[Fields], "str | None"], list[str]]

# The one seam for tests (streams_app.testing.capture_publishes): while a hook is set, publish,
# publish_many and outbox publishes validate and encode as always, then hand the encoded entries to
# the hook instead of Redis or the outbox table. Nothing is monkeypatched and no Redis is needed.
_publish_hook: PublishHook | None = None


def set_publish_hook(hook: PublishHook | None) -> PublishHook | None:
    """Install ``hook(stream, entries, using)`` (``None`` removes it); return the hook it replaces.

    ``entries`` are the fields of each message as XADD would store them; ``using`` is the database
    alias of an outbox publish (the hook decides when it counts: on commit), else None. For a direct
    publish the hook returns one entry id per entry; for an outbox publish its return is ignored.
    """
    global _publish_hook
    previous, _publish_hook = _publish_hook, hook
    return previous


def diverted() -> bool:
    """True while a publish hook is set (a test's capture_publishes): code that writes to Redis beside a
    publish (a task backend's result record) skips that write too, so a captured test needs no Redis."""
    return _publish_hook is not None


def _xadd(conn: Any, stream: str, fields: Fields, maxlen: int | None) -> Any:
    """XADD ``fields`` to ``stream`` on a client or pipeline of our own.

    The command redis-py's ``xadd`` builds, given to ``execute_command`` directly: ``xadd`` checks a
    dozen options Shoal never passes, which cost more per pipelined message (~0.7 µs) than queueing it.
    """
    if maxlen is None:
        return conn.execute_command("XADD", stream, "*", *_flat(fields))
    # MAXLEN ~ lets Redis trim whole radix-tree nodes: cheap, but it drops entries whether or not
    # every group has read them. Streams that must not lose unread entries use retention="acked".
    return conn.execute_command("XADD", stream, "MAXLEN", "~", str(maxlen), "*", *_flat(fields))


def _flat(fields: Fields) -> Iterator[Any]:
    for pair in fields.items():
        yield from pair


def _xadd_on_callers_pipeline(pipeline: Any, stream: str, fields: Fields, maxlen: int | None) -> Any:
    # Whatever pipeline the caller passes gets the public method, as before.
    if maxlen is None:
        return pipeline.xadd(stream, fields)
    return pipeline.xadd(stream, fields, maxlen=maxlen, approximate=True)


def _not_a_stream(conn: Any, stream: str) -> PublishError:
    """XADD met a key of another type: say so, and leave the key alone (it is someone's data)."""
    return PublishError(f"Redis key {stream!r} holds a {key_type(conn, stream)}, not a stream; nothing was published "
                        f"and the key was left as it is. Publish to another stream name, or remove the key yourself.")


def _check_maxlen(maxlen: object) -> None:
    if maxlen is not None and (isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen <= 0):
        raise PublishError(f"maxlen must be a positive integer or None, not {maxlen!r}")


# WAIT must end before the client's socket timeout gives up on the reply (a raw TimeoutError after
# the entry was stored): replicas_timeout_ms stays this far below it.
WAIT_SOCKET_MARGIN_MS = 1000


def _check_replicas(replicas: object, outbox: bool, timeout_ms: object) -> None:
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1):
        raise PublishError(f"replicas must be a positive integer or None, not {replicas!r}")
    if replicas is not None and outbox:
        raise PublishError("replicas= cannot be used with outbox=True: the relay publishes later, on its own connection")
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
        raise PublishError(f"replicas_timeout_ms must be a positive integer of milliseconds, not {timeout_ms!r} "
                           "(WAIT with 0 would block until the replicas confirm, however long that takes)")


def _check_wait_fits(conn: Any, stream: str, timeout_ms: int) -> None:
    """Refuse, before anything is stored, a WAIT that would outlast the client's socket timeout."""
    seconds = node_client(conn, stream).connection_pool.connection_kwargs.get("socket_timeout")
    if seconds is None:
        return
    cap = int(seconds * 1000) - WAIT_SOCKET_MARGIN_MS
    if timeout_ms > cap:
        raise PublishError(
            f"replicas_timeout_ms ({timeout_ms}) must be at most {cap} ms: one second below the Redis client's "
            f"socket timeout ({seconds} s, CACHES[...]['OPTIONS']['SOCKET_TIMEOUT']), or the client would give "
            f"up on WAIT's reply with a connection error after the entry was stored; nothing was published")


def publish(stream: str, payload: Any, *, key: str | None = None, headers: Mapping[str, Any] | None = None,
            maxlen: int | None = None, pipeline: Any = None, codec: str | None = None, outbox: bool = False,
            using: str = "default", replicas: int | None = None, replicas_timeout_ms: int = 1000,
            run_after: datetime.datetime | datetime.timedelta | None = None) -> str | None:
    """Append one message; return its entry id (None when queued on ``pipeline``).

    ``run_after``: an aware datetime, or a timedelta from now (on the Redis clock): the message waits
    in the stream's scheduled set until then (streams_app/publishing/scheduled.py); returns its scheduled id
    (there is no entry id yet), which the entry carries as ``shoal:scheduled_id`` once moved.

    ``outbox=True``: write it to the transactional outbox of database ``using`` instead, in the
    caller's transaction (streams_app/outbox); the relay publishes it after the commit. Returns
    the message key (generated when not given).

    ``replicas=n``: also wait (``WAIT n replicas_timeout_ms``) until n replicas have the entry, and
    raise NotReplicatedError (with the stored ``id``) when fewer confirm in time. Replication is
    asynchronous otherwise: an entry a master acknowledged and then lost in a crash is gone.
    """
    options = (stream, maxlen, codec, outbox, using, pipeline, replicas, replicas_timeout_ms, run_after)
    if not tracing.active():
        return _publish(_plan(*options), payload, key, headers)
    with tracing.publishing(stream, headers, outbox=outbox) as traced:
        # Planned inside the span: a publish refused for its options is a failed span, as one refused for its payload.
        entry_id = _publish(_plan(*options), payload, key, traced.headers)
        if not outbox:  # an outbox publish returns the message key: the entry does not exist yet
            traced.sent(entry_id)
        return entry_id


@dataclass(frozen=True, slots=True)
class _Plan:
    """A publish call's options, checked once and resolved to the one road its messages take to their write.

    ``road``: "outbox" (a row in the caller's transaction), "hook" (a test's capture_publishes),
    "pipeline" (queued on the caller's pipeline), "deferred" (the scheduled set, by a script),
    "replicated" (XADD then WAIT on one connection) or "direct" (XADD, or a MULTI of them).
    """

    road: str
    stream: str
    maxlen: int | None
    codec: str | None
    using: str
    pipeline: Any
    replicas: int | None
    replicas_timeout_ms: int
    due: Any  # scheduled.Due, or None: now


def _plan(stream: str, maxlen: int | None, codec: str | None, outbox: bool, using: str, pipeline: Any,
          replicas: int | None, replicas_timeout_ms: int,
          run_after: datetime.datetime | datetime.timedelta | None) -> _Plan:
    """Every option checked, in the order a caller meets their errors, before any message is encoded."""
    validate_stream_name(stream)
    _check_replicas(replicas, outbox, replicas_timeout_ms)
    if replicas is not None and pipeline is not None:
        raise PublishError("replicas= cannot be used with pipeline=: WAIT must follow the write on its connection")
    _check_maxlen(maxlen)
    due = _due(run_after, pipeline)
    if outbox and pipeline is not None:
        raise PublishError("outbox=True writes to the database, not to a Redis pipeline: pass one or the other")
    if outbox:
        road = "outbox"
    elif _publish_hook is not None:
        road = "hook"
    elif pipeline is not None:
        road = "pipeline"
    elif due is not None:
        road = "deferred"
    elif replicas is not None:
        road = "replicated"
    else:
        road = "direct"
    return _Plan(road, stream, maxlen, codec, using, pipeline, replicas, replicas_timeout_ms, due)


def _publish(plan: _Plan, payload: Any, key: str | None, headers: Mapping[str, Any] | None) -> str | None:
    stream, maxlen = plan.stream, plan.maxlen
    if plan.road == "outbox":
        return _to_outbox(plan, [payload], [key], headers)[0]
    fields = encode_message(payload, key=key, headers=headers, codec=plan.codec)
    if plan.road == "hook":
        return _publish_hook(stream, [fields], None)[0]  # type: ignore[misc]  # the road says it is set
    conn = get_connection()  # once: django-redis's lookup costs a few µs of a ~40 µs publish
    targets = _targets(conn, stream, [key])
    if targets is not None:
        stream = targets[0]
    if plan.road == "pipeline":
        _xadd_on_callers_pipeline(plan.pipeline, stream, fields, maxlen)
        return None
    if plan.replicas is not None:
        _check_wait_fits(conn, stream, plan.replicas_timeout_ms)
    if plan.road == "deferred":
        try:
            return scheduled.publish_deferred(conn, [stream], [fields], maxlen, plan.due, plan.replicas,
                                              plan.replicas_timeout_ms)[0]
        except scheduled.Interrupted as exc:
            raise exc.cause from None  # as a direct publish raises Redis's error
    try:
        if plan.road == "replicated":
            return _publish_replicated(conn, stream, fields, maxlen, plan.replicas, plan.replicas_timeout_ms)  # type: ignore[arg-type]  # the road says replicas is set
        entry_id = _xadd(conn, stream, fields, maxlen)
    except redis.ResponseError as exc:
        if not is_wrongtype(exc):
            raise
        raise _not_a_stream(conn, stream) from None
    return to_text(entry_id)


def _targets(conn: Any, stream: str, keys: list[str | None]) -> list[str] | None:
    """Each message's partition when ``stream`` is partitioned (by the key's CRC-32, the same in every
    process; round-robin without a key), else None. Once per process and stream this also refuses a plain
    publish to a stream recorded as partitioned."""
    if len(partitions.ensure_recorded(conn, stream)) > 1:
        return [partitions.route(stream, key) for key in keys]
    return None


def _due(run_after: datetime.datetime | datetime.timedelta | None, pipeline: Any = None) -> Any:
    """The scheduled.Due of ``run_after`` (None: publish now); PublishError for what cannot be one."""
    if run_after is None:
        return None
    if pipeline is not None:
        raise PublishError("run_after= cannot be used with pipeline=: a deferred message is scheduled by a script "
                           "on the stream's node, not queued as an XADD; nothing was published")
    return scheduled.due_of(run_after)


def _publish_replicated(conn: Any, stream: str, fields: Fields, maxlen: int | None, replicas: int,
                        timeout_ms: int) -> str:
    # WAIT counts the replicas that have this connection's writes, so both go on one connection:
    # a pipeline on the node that holds the stream.
    pipe = slot_pipeline(conn, stream)
    _xadd(pipe, stream, fields, maxlen)
    pipe.execute_command("WAIT", replicas, timeout_ms)
    try:
        entry_id, confirmed = pipe.execute(raise_on_error=False)
    except TRANSIENT_ERRORS:
        recover(conn)  # a node pipeline does not follow a failover by itself
        raise
    if isinstance(entry_id, Exception):
        if isinstance(entry_id, TRANSIENT_ERRORS):
            recover(conn)
        raise entry_id
    entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    if isinstance(confirmed, Exception):
        # Stored, but WAIT was cut short (-UNBLOCKED: the master became a replica in a failover).
        recover(conn)
        raise NotReplicatedError(
            f"entry {entry_id} of {stream!r} is stored but its replication is unknown: WAIT failed "
            f"({confirmed}); a failover is under way", id=entry_id, replicas=0)
    if confirmed < replicas:
        raise NotReplicatedError(
            f"entry {entry_id} of {stream!r} is stored on its master but only {confirmed} of {replicas} "
            f"replica(s) confirmed it within {timeout_ms} ms; a failover now could lose it",
            id=entry_id, replicas=confirmed)
    return entry_id


def _check_many(values: Any, what: str, hint: str) -> None:
    """One payload (or key) where an iterable of them belongs: a dict would publish its keys, a str its
    characters. The annotation cannot say "not str", so the check is here."""
    if isinstance(values, (str, bytes, bytearray, Mapping)):
        raise PublishError(f"{what}, one per message, not a {type(values).__name__}{hint}")


def publish_many(stream: str, payloads: Iterable[Any], *, keys: Iterable[str | None] | None = None,
                 headers: Mapping[str, Any] | None = None, maxlen: int | None = None, codec: str | None = None,
                 outbox: bool = False, using: str = "default", replicas: int | None = None,
                 replicas_timeout_ms: int = 1000,
                 run_after: datetime.datetime | datetime.timedelta | None = None) -> list[str]:
    """Append many messages, 1000 per round trip; return their ids in order.

    ``run_after``: every message is deferred until then (see ``publish``); returns their scheduled ids.

    Every payload is encoded before the first is sent, so bad input publishes nothing (the
    PublishError's ``index`` names the message). Each batch of 1000 is one MULTI/EXEC: Redis
    stores all of it or none of it. When Redis fails after some batches were stored, the
    PartialPublishError says exactly which messages were published (its ``ids``).

    ``outbox=True``: all of them go to the outbox in the caller's transaction; returns their keys.

    ``replicas=n``: also wait (``WAIT n replicas_timeout_ms``) on every master that received
    entries, once, after its last batch, until n of its replicas have them; raise
    NotReplicatedError (``ids`` stored, ``unconfirmed`` indexes) when fewer confirm in time.
    """
    options = (stream, maxlen, codec, outbox, using, None, replicas, replicas_timeout_ms, run_after)
    if not tracing.active():
        return _publish_many(_plan(*options), payloads, keys, headers)
    if not isinstance(payloads, (list, tuple, str, bytes, bytearray, Mapping)):
        payloads = list(payloads)  # counted for the span; _publish_many lists them anyway
    count = len(payloads) if isinstance(payloads, (list, tuple)) else 1
    with tracing.publishing(stream, headers, count, outbox=outbox) as traced:
        return _publish_many(_plan(*options), payloads, keys, traced.headers)


def _publish_many(plan: _Plan, payloads: Iterable[Any], keys: Iterable[str | None] | None,
                  headers: Mapping[str, Any] | None) -> list[str]:
    stream, maxlen = plan.stream, plan.maxlen
    _check_many(payloads, "publish_many() takes an iterable of payloads", "; use publish(stream, payload) for one, "
                "or publish_many(stream, [payload])")
    payloads = list(payloads)
    if keys is not None:
        _check_many(keys, "keys takes an iterable of keys", "")
        keys = list(keys)
        if len(keys) != len(payloads):
            raise PublishError(f"got {len(keys)} keys for {len(payloads)} payloads")
    every_key = keys or [None] * len(payloads)
    if plan.road == "outbox":
        return _to_outbox(plan, payloads, every_key, headers)
    encoded = []
    encode = message_encoder(headers, plan.codec)
    for index, payload in enumerate(payloads):
        try:
            encoded.append(encode(payload, every_key[index]))
        except PublishError as exc:
            error = PublishError(f"message {index}: {exc}")
            error.index, error.reason = index, str(exc)
            raise error from None
    if plan.road == "hook":
        return _publish_hook(stream, encoded, None)  # type: ignore[misc]  # the road says it is set
    conn = get_connection()
    targets = _targets(conn, stream, every_key)
    if plan.replicas is not None:
        for target in set(targets or [stream]):
            _check_wait_fits(conn, target, plan.replicas_timeout_ms)
    if plan.road == "deferred":
        try:
            return scheduled.publish_deferred(conn, targets or [stream] * len(encoded), encoded, maxlen, plan.due,
                                              plan.replicas, plan.replicas_timeout_ms)
        except scheduled.Interrupted as exc:
            raise _partial(stream, exc.ids, exc.in_doubt, exc.cause) from None
    if plan.road == "replicated":
        return _send_replicated(conn, stream, targets or [stream] * len(encoded), encoded, maxlen,
                                plan.replicas, plan.replicas_timeout_ms)  # type: ignore[arg-type]
    return _send_direct(conn, stream, targets, encoded, maxlen)


def _send_direct(conn: Any, stream: str, targets: list[str] | None, encoded: list[Fields],
                 maxlen: int | None) -> list[str]:
    """publish_many's plain road: 1000 per MULTI/EXEC (per partition when ``targets`` are given)."""
    ids: list[str] = []
    for start in range(0, len(encoded), _PIPELINE_CHUNK):
        batch = encoded[start : start + _PIPELINE_CHUNK]
        if targets is not None:
            ids.extend(_send_partitioned(conn, stream, targets[start : start + _PIPELINE_CHUNK], batch, maxlen, ids))
            continue
        try:
            replies = _send_batch(conn, stream, batch, maxlen)
        except redis.ResponseError as exc:
            # A command refused while queued (OOM, WRONGTYPE...) aborts the whole EXEC: none of the batch
            # was stored. (An XADD failing at run time fails alike for the whole batch: one key, one type.)
            if is_wrongtype(exc) and not ids:
                raise _not_a_stream(conn, stream) from None
            raise _partial(stream, ids, 0, exc) from None
        except TRANSIENT_ERRORS as exc:
            recover(conn)  # a node pipeline does not follow a failover by itself
            raise _partial(stream, ids, len(batch), exc) from None
        ids.extend(to_text(i) for i in replies)
    return ids


def _send_batch(conn: Any, stream: str, batch: list[Fields], maxlen: int | None) -> Any:
    """One MULTI/EXEC of ``batch`` on the node that holds ``stream``; its replies.

    A plain pipeline on the node, not a cluster pipeline: measured, a cluster client's transaction
    pipeline costs ~27 µs of client CPU per XADD, a node pipeline ~15 µs. A node pipeline does not
    follow a moved slot or a failover by itself: a redirect (MOVED/ASK) or READONLY comes back while
    the commands are queued, so EXEC aborts and nothing is stored; that batch then goes through the
    cluster client's own transaction pipeline, which follows redirects, and the slot map is refreshed.
    """
    pipe = slot_pipeline(conn, stream, transaction=True)
    for fields in batch:
        _xadd(pipe, stream, fields, maxlen)
    try:
        return pipe.execute()
    except (MovedError, AskError, redis.exceptions.ReadOnlyError):
        if not is_cluster(conn):
            raise
    recover(conn)
    pipe = conn.pipeline(transaction=True)
    for fields in batch:
        _xadd(pipe, stream, fields, maxlen)
    return pipe.execute()


def _to_outbox(plan: _Plan, payloads: list[Any], keys: list[str | None], headers: Mapping[str, Any] | None) -> list[str]:
    from streams_app.outbox import enqueue

    stream, maxlen, due = plan.stream, plan.maxlen, plan.due
    enqueue.check_row(stream, maxlen)
    encoded, checked = [], []
    encode = message_encoder(headers, plan.codec)
    for index, (payload, key) in enumerate(zip(payloads, keys)):
        try:
            checked.append(enqueue.check_key(key))
            encoded.append(encode(payload, checked[-1]))
        except PublishError as exc:
            error = PublishError(f"message {index}: {exc}" if len(keys) > 1 else str(exc))
            error.index, error.reason = index, str(exc)
            raise error from None
    if due is not None:  # the relay schedules the row's message (outbox/relay.py): due by this clock, as of now
        at = scheduled.absolute(due).ms
        for fields, scheduled_id in zip(encoded, scheduled.new_ids(len(encoded))):
            fields.update({scheduled.RUN_AFTER_FIELD: str(at), scheduled.SCHEDULED_ID_FIELD: scheduled_id})
    if _publish_hook is not None:
        for fields in encoded:  # as enqueue stores them: the guards deduplicate the relay's copies by it
            fields[IDEMPOTENCY_ID_FIELD] = enqueue.new_idempotency_id()
        _publish_hook(stream, encoded, plan.using)
        return checked
    return enqueue.enqueue(stream, encoded, checked, maxlen, plan.using)


def _partial(stream: str, ids: list[str], in_doubt: int, cause: BaseException) -> PartialPublishError:
    done = f"{len(ids)} messages were published (last id {ids[-1]})" if ids else "no message was published"
    doubt = f", the next {in_doubt} may or may not have been stored" if in_doubt else ""
    return PartialPublishError(f"Redis failed part-way through publishing to {stream!r} ({type(cause).__name__}: "
                               f"{cause}): {done}{doubt}", ids=ids, in_doubt=in_doubt, cause=cause)


def _send_partitioned(conn: Any, stream: str, targets: list[str], batch: list[Fields], maxlen: int | None,
                      done: list[str]) -> list[Any]:
    """One batch of a partitioned stream: each partition's share in one MULTI/EXEC on its node.

    A transaction cannot span slots, so a batch is atomic per partition, not as a whole: when
    Redis fails part-way, the messages after the last one known stored are reported in doubt.
    """
    replies: list[Any] = [None] * len(batch)
    shares: dict[str, list[int]] = {}  # partition -> positions in the batch, partitions in order of first appearance
    for i, target in enumerate(targets):
        shares.setdefault(target, []).append(i)
    for target, positions in shares.items():
        pipe = slot_pipeline(conn, target, transaction=True)
        for i in positions:
            _xadd(pipe, target, batch[i], maxlen)
        try:
            stored = pipe.execute()
        except (*TRANSIENT_ERRORS, redis.exceptions.ReadOnlyError) as exc:
            recover(conn)  # a node pipeline does not follow a failover by itself
            raise _partial(stream, done + _prefix(replies), len(batch) - len(_prefix(replies)), exc) from None
        except redis.ResponseError as exc:
            if is_wrongtype(exc) and not done and all(r is None for r in replies):
                raise _not_a_stream(conn, target) from None
            raise _partial(stream, done + _prefix(replies), len(batch) - len(_prefix(replies)), exc) from None
        for i, entry_id in zip(positions, stored):
            replies[i] = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return replies


def _prefix(replies: list[Any]) -> list[str]:
    known = []
    for entry_id in replies:
        if entry_id is None:
            break
        known.append(entry_id)
    return known


def _send_replicated(conn: Any, stream: str, targets: list[str], encoded: list[Fields], maxlen: int | None,
                     replicas: int, timeout_ms: int) -> list[Any]:
    """publish_many with WAIT: per batch and master, one plain pipeline on that master holding a
    MULTI/EXEC per stream (a transaction cannot span slots), and, after the master's last batch,
    WAIT on the same connection (WAIT counts the replicas that have this connection's writes; a
    master's replication offset only grows, so its last write covers its earlier ones)."""
    node_of = {target: _node_name(conn, target) for target in set(targets)}
    nodes = [node_of[target] for target in targets]
    last_batch = {node: start for start in range(0, len(encoded), _PIPELINE_CHUNK)
                  for node in nodes[start : start + _PIPELINE_CHUNK]}
    ids: list[Any] = [None] * len(encoded)
    confirmed_by = {}
    for start in range(0, len(encoded), _PIPELINE_CHUNK):
        positions = range(start, min(start + _PIPELINE_CHUNK, len(encoded)))
        for node in dict.fromkeys(nodes[i] for i in positions):
            blocks: dict[str, list[int]] = {}
            for i in positions:
                if nodes[i] == node:
                    blocks.setdefault(targets[i], []).append(i)
            pipe = node_client(conn, next(iter(blocks))).pipeline(transaction=False)
            for target, members in blocks.items():
                pipe.execute_command("MULTI")
                for i in members:
                    _xadd(pipe, target, encoded[i], maxlen)
                pipe.execute_command("EXEC")
            waits = last_batch[node] == start
            if waits:
                pipe.execute_command("WAIT", replicas, timeout_ms)
            try:
                replies = pipe.execute(raise_on_error=False)
            except TRANSIENT_ERRORS as exc:
                recover(conn)  # a node pipeline does not follow a failover by itself
                raise _partial_of(stream, ids, max(i for members in blocks.values() for i in members), exc) from None
            failure = _stored_blocks(blocks, replies, ids)
            if failure is not None:
                target, error = failure
                if isinstance(error, (*TRANSIENT_ERRORS, redis.exceptions.ReadOnlyError)):
                    recover(conn)
                if is_wrongtype(error) and not any(ids):
                    raise _not_a_stream(conn, target) from None
                raise _partial_of(stream, ids, -1, error) from None
            if waits:
                confirmed = replies[-1]
                if isinstance(confirmed, Exception):
                    recover(conn)  # -UNBLOCKED: the master became a replica in a failover
                confirmed_by[node] = 0 if isinstance(confirmed, Exception) else confirmed
    short = {node: n for node, n in confirmed_by.items() if n < replicas}
    if short:
        unconfirmed = [i for i, node in enumerate(nodes) if node in short]
        fewest = min(short.values())
        raise NotReplicatedError(
            f"{len(encoded)} messages of {stream!r} are stored, but {len(unconfirmed)} of them are on a master "
            f"that had only {fewest} of {replicas} replica(s) confirm within {timeout_ms} ms; a failover now "
            f"could lose them (their indexes are in .unconfirmed)", id=None, replicas=fewest, ids=ids,
            unconfirmed=unconfirmed)
    return ids


def _stored_blocks(blocks: dict[str, list[int]], replies: list[Any], ids: list[Any]) -> tuple[str, Any] | None:
    """Record the ids of each MULTI/EXEC block in ``replies``; return (stream, error) of the first that failed.

    Each block's replies are MULTI's, one QUEUED per XADD (or the error that refused it while queued)
    and EXEC's (the ids, or EXECABORT when a command was refused).
    """
    failure, at = None, 0
    for target, members in blocks.items():
        block = replies[at : at + len(members) + 2]
        at += len(members) + 2
        stored = block[-1]
        errors = [r for r in block[:-1] if isinstance(r, Exception)]
        errors += [stored] if isinstance(stored, Exception) else [r for r in stored if isinstance(r, Exception)]
        if errors:
            failure = failure or (target, errors[0])
            continue
        for i, entry_id in zip(members, stored):
            ids[i] = to_text(entry_id)
    return failure


def _partial_of(stream: str, ids: list[Any], last_sent: int, cause: BaseException) -> PartialPublishError:
    """PartialPublishError for ``ids`` filled where stored: those after the stored prefix, up to the
    last one stored or sent (``last_sent``), may or may not have been."""
    known = _prefix(ids)
    stored = [i for i, entry_id in enumerate(ids) if entry_id is not None]
    end = max([last_sent, *stored]) + 1
    return _partial(stream, known, max(0, end - len(known)), cause)


def _node_name(conn: Any, key: str) -> str:
    return conn.get_node_from_key(key).name if is_cluster(conn) else ""
