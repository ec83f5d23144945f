"""Where consumer groups stand in their streams: a group's last-delivered id (``delivered_id``), and
its backlog: XINFO GROUPS ``lag``, estimated where Redis reports none.

Redis 7 reports ``lag`` as null when it cannot compute it (an unread entry was deleted with XDEL,
the stream was trimmed past the group, the group was set to an arbitrary id). Null is not zero: a
null taken for zero would scale a busy pool down. The estimate counts the entries after the
group's last-delivered id, up to a cap (enough for any scaling decision), with one XRANGE.

Before Redis 7.4 a non-null ``lag`` can be wrong too: a replica that full-synced while a group was
being read keeps the ``entries-read`` of its sync (XREADGROUP reaches it as XCLAIM ... LASTID, which
leaves the counter alone; redis/redis#10569, fixed in 7.4 by #12898), so once promoted it reports
``lag`` too high by that gap, for good (a pool following it never scales down). A stale counter
only ever overstates, so on those versions a non-zero lag is checked by counting (``checked_lag``):
cheap when consumers keep up, bounded by CHECK_CAP when they do not.
"""
import re
import threading
import time
from dataclasses import dataclass

import redis

from shoal_common.redis_errors import is_no_permission, is_no_such_key, is_wrongtype
from shoal_common.redisconn import node_client
from shoal_common.text import to_text

ESTIMATE_CAP = 10_000
"""An estimated lag is counted up to this many entries; more is reported as the cap."""

CHECK_CAP = 1_000
"""A lag Redis may have overstated is checked with XRANGEs of at most this many entries (~5 ms each)."""

TRUSTED_LAG_VERSION = (7, 4)
"""From this Redis version on, a non-null XINFO GROUPS lag survives a replica's full sync."""

_VERSION_TTL = 300.0  # seconds: a node upgraded in place is believed within five minutes
_versions = {}
_versions_lock = threading.Lock()


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
    info = find_group(groups, group)
    if info is None:
        # The workers create the group when they start; from "0" it will read the whole stream.
        return GroupLag(stream, group, conn.xlen(stream) if start == "0" else 0, estimated=True)
    value, estimated = backlog(conn, stream, info, cap)
    return GroupLag(stream, group, value, estimated=estimated)


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
    info = find_group(groups, group)
    return None if info is None else to_text(_info(info, "last-delivered-id"))


def find_group(groups, name):
    """The XINFO GROUPS entry of the group called ``name``: the group whose name is those bytes (or
    that text), else the one the pages show as ``name`` (``to_shown``: a name that is not UTF-8, which
    another client may give its group, with its bad bytes as \\xNN escapes). None: no such group.

    Never decodes a name strictly: one group of another client must not break every other group's lookup.
    """
    wanted = name_bytes(name)
    escaped = None
    for info in groups:
        raw = name_bytes(_info(info, "name"))
        if raw == wanted:
            return info
        if escaped is None and isinstance(name, str) and to_shown(raw) == name:
            escaped = info
    return escaped


def name_bytes(name):
    """A group or consumer name as the bytes Redis holds (a str as UTF-8; a lone surrogate, as
    ``os.fsdecode`` makes of a bad byte, as that byte)."""
    if not isinstance(name, str):
        return name
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte makes: no name Redis holds
        return name.encode("utf-8", "backslashreplace")


def to_shown(name):
    """A group or consumer name as text for pages, links, forms and the admin's mirror rows, read back
    by ``from_shown``: a backslash as ``\\\\``, a byte that is not UTF-8 as ``\\xNN``, NUL as ``\\x00``
    (an HTML form cannot send a raw NUL, PostgreSQL text cannot hold it).

    Reversible, so two names never share a text: another client may name one group with the byte 0xFF
    and another with the four characters ``\\xff``, and the admin must reach each. A name of ASCII
    without a backslash (nearly every name) is shown as it is.
    """
    text = to_text(name, errors="surrogateescape")
    if text.isascii() and "\\" not in text and "\x00" not in text:
        return text
    return "".join(_SHOWN.get(ch, ch) if ch < "\udc80" or ch > "\udcff" else f"\\x{ord(ch) - 0xdc00:02x}"
                   for ch in text)


_SHOWN = {"\\": "\\\\", "\x00": "\\x00"}
_ESCAPE = re.compile(r"\\(\\|x[0-9a-fA-F]{2})")


def from_shown(text):
    """The name ``to_shown`` showed as ``text``, as Redis holds it: str when it is UTF-8, else bytes.

    A backslash that starts no escape is taken as it is: a plain name typed into a link still works.
    """
    if "\\" not in text:
        return text
    raw, pos = bytearray(), 0
    for escape in _ESCAPE.finditer(text):
        raw += name_bytes(text[pos:escape.start()])
        raw += b"\\" if escape.group(1) == "\\" else bytes([int(escape.group(1)[1:], 16)])
        pos = escape.end()
    raw += name_bytes(text[pos:])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(raw)


def backlog(conn, stream, info, cap=ESTIMATE_CAP):
    """(entries not yet delivered, estimated) for one group's XINFO GROUPS ``info`` on ``stream``.

    ``estimated`` is true when the figure is not Redis's ``lag`` (null, or overstated and counted).
    """
    lag = _info(info, "lag")
    last_delivered = _str(_info(info, "last-delivered-id"))
    if lag is None:
        return estimate_lag(conn, stream, last_delivered, cap), True
    lag = int(lag)
    if lag == 0 or lag_is_trusted(conn, stream):
        return lag, False
    counted = checked_lag(conn, stream, last_delivered, lag)
    return counted, counted != lag


def estimate_lag(conn, stream, last_delivered_id, cap=ESTIMATE_CAP):
    """Entries after ``last_delivered_id`` (exclusive), counted up to ``cap``."""
    if last_delivered_id in (None, "0-0"):
        return min(conn.xlen(stream), cap)
    return len(conn.xrange(stream, min=f"({last_delivered_id}", max="+", count=cap))


def checked_lag(conn, stream, last_delivered_id, lag, cap=CHECK_CAP):
    """``lag`` as Redis reported it, or the real count after ``last_delivered_id`` where it is less.

    Only an overstated lag is looked for (a stale ``entries-read`` is too low, never too high).
    Counts the entries after the last delivered id up to min(lag, cap); past the cap, the entries
    up to it (Shoal trims acknowledged entries, so that side is usually short) and subtracts them
    from XLEN. When both sides hold more than ``cap``, the lag stands (it is then at least ``cap``).
    """
    if last_delivered_id in (None, "0-0"):
        return min(lag, conn.xlen(stream))
    wanted = min(lag, cap)
    after = len(conn.xrange(stream, min=f"({last_delivered_id}", max="+", count=wanted))
    if after < wanted:
        return after
    if lag <= cap:
        return lag
    pipe = node_client(conn, stream).pipeline(transaction=False)
    pipe.xlen(stream)
    pipe.xrange(stream, min="-", max=last_delivered_id, count=cap)
    length, before = pipe.execute()
    if len(before) < cap:
        return min(lag, length - len(before))
    return min(lag, length)


def lag_is_trusted(conn, stream):
    """Whether the node holding ``stream`` runs a Redis whose non-null lag can be taken as is (>= 7.4)."""
    return _server_version(conn, stream) >= TRUSTED_LAG_VERSION


def _server_version(conn, stream):
    node = node_client(conn, stream)
    kwargs = node.connection_pool.connection_kwargs
    address = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"))
    now = time.monotonic()
    with _versions_lock:
        cached = _versions.get(address)
    if cached and now - cached[1] < _VERSION_TTL:
        return cached[0]
    try:
        text = _str(node.info("server").get("redis_version", "0"))
        version = tuple(int(part) for part in text.split(".")[:2] if part.isdigit())
    except redis.ResponseError as exc:
        if not is_no_permission(exc):
            raise
        version = (0, 0)  # a user that may not run INFO: count rather than trust
    with _versions_lock:
        _versions[address] = (version, now)
    return version


def read_lags(conn, specs, cap=ESTIMATE_CAP):
    """GroupLag for each consumer spec (stream, group, start)."""
    return [group_lag(conn, spec.stream, spec.group, spec.start, cap) for spec in specs]
