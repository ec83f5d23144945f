"""How much a group still has to do on a stream: what repartition waits for before a partition is done.

A group has drained a stream when it has read up to the stream's last id (``last-delivered-id`` at or
after ``last-generated-id``) and acknowledged everything it read (nothing pending): every entry was
handled (or dead-lettered, which acknowledges it). Used by ``repartition`` (the drain phase) and by an
ordered partition of a new epoch, which waits for its feeders (streams_app.consuming.gate).
"""
from shoal_common.text import to_text
from streams_app.redis import keys


def _id(text):
    ms, _, seq = to_text(text).partition("-")
    return int(ms), int(seq or 0)


def _field(info, name):
    for key, value in info.items():
        if to_text(key) == name:
            return value
    return None


def groups(conn, stream):
    """The groups of ``stream``: those on it now and those Shoal remembers creating ({S}:groups)."""
    names = {to_text(g) for g in conn.smembers(keys.groups_key(stream))}
    if conn.exists(stream):
        names |= {to_text(_field(info, "name")) for info in conn.xinfo_groups(stream)}
    return sorted(names)


def left(conn, stream):
    """{group: entries not yet handled (unread after its last read + pending)} of ``stream``.

    A group remembered but missing from the stream (lost, being recreated) counts as everything."""
    if not conn.exists(stream):
        return {}
    last = _id(_field(conn.xinfo_stream(stream), "last-generated-id"))
    length = conn.xlen(stream)
    result = {}
    present = {}
    for info in conn.xinfo_groups(stream):
        present[to_text(_field(info, "name"))] = info
    for group in groups(conn, stream):
        info = present.get(group)
        if info is None:
            result[group] = length
            continue
        pending = int(_field(info, "pending") or 0)
        delivered = _field(info, "last-delivered-id")
        if _id(delivered) >= last:
            unread = 0
        else:
            lag = _field(info, "lag")
            unread = int(lag) if lag is not None else len(conn.xrange(stream, min=f"({to_text(delivered)}", max="+"))
            unread = max(unread, 1)  # an id after its last read exists: not drained, whatever lag says
        result[group] = pending + unread
    return result


def drained(conn, stream, group):
    """True when ``group`` has handled everything of ``stream`` (a stream or group never made: nothing to do)."""
    if not conn.exists(stream):
        return True
    if group not in groups(conn, stream):
        return conn.xlen(stream) == 0
    return left(conn, stream).get(group, 0) == 0
