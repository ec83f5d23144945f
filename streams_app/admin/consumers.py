"""Who is alive: a group's consumers with their liveness, from what Redis already holds.

XINFO CONSUMERS says what a group's consumers hold and how long they have been idle, not whether
their process lives: a SIGKILLed worker stays listed. Each worker process renews a deadline per
stream it reads (``{stream}:consumers``, streams_app/consuming/liveness.py); compared with the
Redis clock it says *alive* (deadline ahead), *dead* (lapsed: killed, OOM, lost host) or *unknown*
(no record: another client, an older deployment, or a clean exit). A worker whose blocking read
made no group consumer yet (Redis 7.0 makes none for a read that returned nothing) is known by its
deadline only: it is listed as alive on the stream, not yet in the group.
"""
from dataclasses import dataclass

import redis

from shoal_common.redis_errors import is_missing, is_wrongtype
from streams_app.redis.connection import TRANSIENT_ERRORS, node_client
from streams_app.redis.keys import key_type, liveness_key
from streams_app.redis.lag import to_shown

ALIVE, DEAD, UNKNOWN = "alive", "dead", "unknown"


@dataclass(frozen=True)
class Consumer:
    name: str
    liveness: str  # ALIVE, DEAD or UNKNOWN
    deadline_in: float | None  # seconds to the liveness deadline; negative: lapsed that long ago
    pending: int = 0
    idle: float | None = None  # seconds since its last read or claim (XINFO CONSUMERS); None: not in the group
    inactive: float | None = None  # seconds since its last successful read (Redis >= 7.2)
    raw: bytes | str | None = None  # the name as Redis holds it (None: ``name`` as it is)

    @property
    def in_group(self):
        return self.idle is not None

    @property
    def lapsed_for(self):
        """Seconds since a dead consumer's deadline lapsed."""
        return -self.deadline_in if self.deadline_in is not None and self.deadline_in <= 0 else None

    @property
    def claimable(self):
        """A target for claimed entries: not known dead."""
        return self.liveness != DEAD


def wrong_type_problem(conn, key, wanted, consequence):
    """A page's warning for an auxiliary key of another type: named, left as it is, never a 500."""
    return (f"Redis key {key!r} holds a {key_type(conn, key)}, not a {wanted}: {consequence}. "
            "Shoal leaves the key as it is.")


def deadlines(conn, stream, problems=None, raw_names=None):
    """{consumer name: seconds to its liveness deadline (negative once lapsed)}, on the Redis clock.

    A liveness key of another type reads as no record (liveness unknown), named in ``problems``.
    ``raw_names`` (a dict) is filled with shown name -> the name as Redis holds it.
    """
    node = node_client(conn, liveness_key(stream))
    pipe = node.pipeline(transaction=False)
    pipe.hgetall(liveness_key(stream))
    pipe.time()
    records, (seconds, micros) = pipe.execute(raise_on_error=False)
    if isinstance(records, Exception):
        if not is_wrongtype(records):
            raise records
        if problems is not None:
            problems.append(wrong_type_problem(conn, liveness_key(stream), "hash",
                                               "the consumers' liveness cannot be read and shows as unknown"))
        records = {}
    now_ms = seconds * 1000 + micros // 1000
    out = {}
    for name, deadline in records.items():
        try:
            out[to_shown(name)] = (int(deadline) - now_ms) / 1000
            if raw_names is not None:
                raw_names[to_shown(name)] = name
        except ValueError:
            continue
    return out


def state(deadline_in):
    if deadline_in is None:
        return UNKNOWN
    return ALIVE if deadline_in > 0 else DEAD


def group_consumers(conn, stream, group, problems=None):
    """The group's consumers with their liveness, then live readers of the stream not in the group yet.

    [] when the stream or group is gone or Redis cannot be read (the caller's page says so); a
    liveness key of another type is named in ``problems``.
    """
    try:
        rows = conn.xinfo_consumers(stream, group)
        raw_names = {}
        by_name = deadlines(conn, stream, problems, raw_names)
    except redis.ResponseError as exc:
        if is_missing(exc):
            return []
        raise
    except TRANSIENT_ERRORS:
        return []
    members = [Consumer(name=to_shown(r["name"]), liveness=state(by_name.get(to_shown(r["name"]))),
                        deadline_in=by_name.get(to_shown(r["name"])), pending=r["pending"], idle=r["idle"] / 1000,
                        inactive=r["inactive"] / 1000 if r.get("inactive", -1) >= 0 else None, raw=r["name"])
               for r in rows]
    known = {c.name for c in members}
    # A reader not in the group yet is claimed to under its own name as the worker sent it: the
    # escaped text would make a consumer nobody runs.
    readers = [Consumer(name=name, liveness=ALIVE, deadline_in=left, raw=raw_names.get(name))
               for name, left in sorted(by_name.items()) if left > 0 and name not in known]
    return members + readers
