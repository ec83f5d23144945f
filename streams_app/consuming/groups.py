"""Consumer-group setup: idempotent, and never destructive."""
import redis

from shoal_common.redis_errors import is_busygroup, is_nogroup, is_wrongtype  # noqa: F401  (re-exported)
from shoal_common.text import to_text
from streams_app.exceptions import StreamTypeError


def ensure_group(conn, stream, group, start="0"):
    """Create ``group`` on ``stream`` (and the stream) unless it exists. Return True if created.

    BUSYGROUP means another process created it first: that is success. A key of another type is
    reported and left untouched.
    """
    try:
        conn.xgroup_create(stream, group, id=start, mkstream=True)
    except redis.ResponseError as exc:
        if is_busygroup(exc):
            return False
        if is_wrongtype(exc):
            kind = key_type(conn, stream)
            raise StreamTypeError(
                f"Redis key {stream!r} holds a {kind}, not a stream, so group {group!r} cannot be created "
                f"on it. Shoal has left the key as it is: rename the stream in @consumer(...) or remove "
                f"the key yourself."
            ) from None
        raise
    return True


def key_type(conn, key):
    return to_text(conn.type(key))
