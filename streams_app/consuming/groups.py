"""Consumer-group setup: idempotent, and never destructive. A group that existed before is handed to
the lost-group protocol (lost_group.settle_recreated)."""
import redis

from shoal_common.redis_errors import is_busygroup, is_nogroup, is_oom, is_wrongtype  # noqa: F401  (re-exported)
from streams_app.redis import keys
from streams_app.consuming.lost_group import settle_recreated
from streams_app.exceptions import StreamTypeError
from streams_app.redis.lag import group_exists


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
        settle_recreated(conn, stream, group, start)
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


def _remember(conn, stream, group):
    """Add ``group`` to the stream's set of groups; False when it was there already (the group was lost)."""
    try:
        return bool(conn.sadd(keys.groups_key(stream), group))
    except redis.ResponseError as exc:
        if is_oom(exc):  # at maxmemory: nothing is known, nothing is settled
            return True
        raise
