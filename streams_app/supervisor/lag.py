"""The backlog of consumer groups: XINFO GROUPS ``lag``, estimated where Redis reports none.

Redis 7 reports ``lag`` as null when it cannot compute it (an unread entry was deleted with XDEL,
the stream was trimmed past the group, the group was set to an arbitrary id). Null is not zero: a
null taken for zero would scale a busy pool down. The estimate counts the entries after the
group's last-delivered id, up to a cap (enough for any scaling decision), with one XRANGE.
"""
from dataclasses import dataclass

import redis

from shoal_common.redis_errors import is_no_such_key
from shoal_common.text import to_text

ESTIMATE_CAP = 10_000
"""An estimated lag is counted up to this many entries; more is reported as the cap."""


@dataclass(frozen=True)
class GroupLag:
    stream: str
    group: str
    lag: int
    estimated: bool = False


_str = to_text


def _info(info, key):
    # redis-py decodes XINFO keys; values are bytes unless the client decodes responses.
    return info.get(key, info.get(key.encode()) if isinstance(key, str) else None)


def group_lag(conn, stream, group, start="0", cap=ESTIMATE_CAP):
    """The backlog of ``group`` on ``stream`` as a GroupLag; a missing stream has none."""
    try:
        groups = conn.xinfo_groups(stream)
    except redis.ResponseError as exc:
        if is_no_such_key(exc):
            return GroupLag(stream, group, 0)
        raise
    info = next((g for g in groups if _str(_info(g, "name")) == group), None)
    if info is None:
        # The workers create the group when they start; from "0" it will read the whole stream.
        return GroupLag(stream, group, conn.xlen(stream) if start == "0" else 0, estimated=True)
    lag = _info(info, "lag")
    if lag is not None:
        return GroupLag(stream, group, int(lag))
    return GroupLag(stream, group, estimate_lag(conn, stream, _str(_info(info, "last-delivered-id")), cap), estimated=True)


def estimate_lag(conn, stream, last_delivered_id, cap=ESTIMATE_CAP):
    """Entries after ``last_delivered_id`` (exclusive), counted up to ``cap``."""
    if last_delivered_id in (None, "0-0"):
        return min(conn.xlen(stream), cap)
    return len(conn.xrange(stream, min=f"({last_delivered_id}", max="+", count=cap))


def read_lags(conn, specs, cap=ESTIMATE_CAP):
    """GroupLag for each consumer spec (stream, group, start)."""
    return [group_lag(conn, spec.stream, spec.group, spec.start, cap) for spec in specs]
