"""Consumer-group setup: idempotent, and never destructive."""
import redis

from streams_app.exceptions import StreamTypeError


def ensure_group(conn, stream, group, start="0"):
    """Create ``group`` on ``stream`` (and the stream) unless it exists. Return True if created.

    BUSYGROUP means another process created it first: that is success. A key of another type is
    reported and left untouched.
    """
    try:
        conn.xgroup_create(stream, group, id=start, mkstream=True)
    except redis.ResponseError as exc:
        message = str(exc)
        if message.startswith("BUSYGROUP"):
            return False
        if message.startswith("WRONGTYPE"):
            kind = key_type(conn, stream)
            raise StreamTypeError(
                f"Redis key {stream!r} holds a {kind}, not a stream, so group {group!r} cannot be created "
                f"on it. Shoal has left the key as it is: rename the stream in @consumer(...) or remove "
                f"the key yourself."
            ) from None
        raise
    return True


def is_nogroup(exc):
    """The group (or the stream) vanished, e.g. a Redis without persistence restarted."""
    # "in", not startswith: redis-py prefixes errors raised from a pipeline ("Command # 1 (...) of pipeline caused error: NOGROUP ...").
    return isinstance(exc, redis.ResponseError) and "NOGROUP" in str(exc)


def is_wrongtype(exc):
    """A command met a key of another type (pipelines prefix the message, so not startswith)."""
    return isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc)


def key_type(conn, key):
    kind = conn.type(key)
    return kind.decode() if isinstance(kind, bytes) else kind
