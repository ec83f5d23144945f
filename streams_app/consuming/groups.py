"""Consumer-group setup: idempotent, and never destructive."""
import logging

import redis

from shoal_common.redis_errors import is_busygroup, is_nogroup, is_oom, is_wrongtype  # noqa: F401  (re-exported)
from shoal_common.text import to_text
from streams_app import keys, scripts
from streams_app.entry_ids import id_key
from streams_app.exceptions import StreamTypeError

logger = logging.getLogger("streams_app.consumer")


def ensure_group(conn, stream, group, start="0"):
    """Create ``group`` on ``stream`` (and the stream) unless it exists. Return True if created.

    BUSYGROUP means another process created it first: that is success. A key of another type is
    reported and left untouched. At maxmemory Redis refuses XGROUP CREATE before it would say
    BUSYGROUP: an existing group is then ready all the same (reading and acking work at maxmemory);
    a missing one cannot be made, and the OOM error is raised.
    """
    try:
        conn.xgroup_create(stream, group, id=start, mkstream=True)
    except redis.ResponseError as exc:
        if is_busygroup(exc):
            _remember(conn, stream, group)  # groups made before Shoal kept the set, once per start
            return False
        if is_oom(exc) and group_exists(conn, stream, group):
            return False
        if is_wrongtype(exc):
            kind = keys.key_type(conn, stream)
            raise StreamTypeError(
                f"Redis key {stream!r} holds a {kind}, not a stream, so group {group!r} cannot be created "
                f"on it. Shoal has left the key as it is: rename the stream in @consumer(...) or remove "
                f"the key yourself."
            ) from None
        raise
    if not _remember(conn, stream, group):
        _settle_recreated(conn, stream, group, start)
    # Failures end in the dead-letter key: of another type, the first dead-lettering would crash the
    # read loop long after the start. Found here, the start fails as for the stream key (exit 3).
    dead_letters = keys.dead_letter_key(stream)
    kind = keys.key_type(conn, dead_letters)
    if kind not in ("stream", "none"):
        raise StreamTypeError(
            f"Redis key {dead_letters!r} (the dead letters of {stream!r}) holds a {kind}, not a stream, so group "
            f"{group!r} could not dead-letter its failures. Shoal has left the key as it is: remove or rename it yourself."
        )
    return True


LOST_GROUP_OUTCOMES = {"created": "recreated", "advanced": "moved forward", "kept": "already recreated; kept"}


def _remember(conn, stream, group):
    """Add ``group`` to the stream's set of groups; False when it was there already (the group was lost)."""
    try:
        return bool(conn.sadd(keys.groups_key(stream), group))
    except redis.ResponseError as exc:
        if is_oom(exc):  # at maxmemory: nothing is known, nothing is settled
            return True
        raise


def _settle_recreated(conn, stream, group, start):
    """A starting consumer just made a group that existed before: lost under consumers that may still
    run (busy ones learn of a loss only at their keep-alive or next read). Its settling marker makes
    every read while it lives be taken back, and makes those consumers move the group forward to what
    they read and put back what they hold (see recreate_group.lua), as if one of them had recreated it;
    without it they would not notice, and the entries they had read would be delivered again."""
    from streams_app.consuming.loop import lost_group_settle_seconds  # the loop module imports this one

    if not conn.xlen(stream):
        return
    settle_ms = int(lost_group_settle_seconds() * 1000)
    try:
        conn.set(keys.settling_key(stream, group), "0-0", px=settle_ms, nx=True)
    except redis.ResponseError as exc:
        if not is_oom(exc):
            raise
    logger.warning("Group %s on %s was created at %s but existed before (lost: XGROUP DESTROY or DEL of the stream); "
                   "reads are held for %.1f s so that consumers still running move it to what they read",
                   group, stream, start, settle_ms / 1000)


def recreate_lost_group(conn, stream, group, last_read_id, start, settle_ms=0):
    """Recreate a group lost under running consumers where it stood; return (what was done, settle).

    Each consumer knows only what it read itself; the group stood at the largest of those ids
    (XREADGROUP > hands entries out in id order, so whoever read last read the largest). Every
    consumer that finds the group gone runs one script (lua/recreate_group.lua) that creates it
    at its own last read id (``start`` if it read nothing), or moves it forward to that id if
    another consumer created it further back. ``settle`` is True when the stream still holds
    entries this consumer may have read (XGROUP DESTROY; after a flush or a restart without
    persistence only newer ids are left): the caller then must not read until every live
    consumer has had time to move the group forward. A group created with ``settle_ms`` is marked
    as settling for that long (keys.settling_key): consumers that read meanwhile take the read back.
    """
    what, first = scripts.run(conn, "recreate_group", [stream, keys.settling_key(stream, group)],
                              [group, last_read_id or start, int(settle_ms)])
    first = to_text(first)
    settle = bool(first) and (last_read_id is None or id_key(first) <= id_key(last_read_id))
    return LOST_GROUP_OUTCOMES[to_text(what)], settle


def group_exists(conn, stream, group):
    return delivered_id(conn, stream, group) is not None  # every group has one ("0-0" when new)


def delivered_id(conn, stream, group):
    """The group's last-delivered-id: everything up to it was read by some consumer (None: no such group)."""
    try:
        groups = conn.xinfo_groups(stream)
    except redis.ResponseError as exc:
        if is_wrongtype(exc):
            raise
        return None  # no such key
    return next((to_text(g["last-delivered-id"]) for g in groups if to_text(g["name"]) == group), None)
