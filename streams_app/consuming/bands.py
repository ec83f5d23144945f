"""Priority bands: a band's read loop reads new entries only while the bands above it have none unread.

A consumer declared with ``bands=`` (streams_app.registry) is one stream per band, each read by its
own GroupLoop of the same group. Before each read of new entries, a band's loop asks Redis whether
any higher band's stream holds entries the group has not been delivered (XINFO GROUPS ``lag``). If
one does, it reads nothing this pass and waits YIELD_SECONDS for its running handlers instead.

What "before" means: a task of a higher band is read before those of the lower bands still in
Redis. Entries a loop has already read (at most its free handler slots, two per thread) still run
first, and so do entries being retried or taken over, which are not new reads. Under concurrency
the bands run side by side whenever the higher ones have nothing left unread.

What an idle band costs: a band whose higher bands are all read in this process by loops blocked in a
read after one that found nothing (``higher_bands_idle``) neither asks XINFO GROUPS nor keeps its read
short: a higher band cannot hold unread entries while one of its readers waits in XREADGROUP (Redis hands
them to it at once), so the band blocks for BLOCK_MS like any loop. Otherwise it asks before each read
and blocks at most YIELD_SECONDS, so that a higher band filling up is seen soon. (Should a higher band
fill up while this band waits, this band's read, when entries of its own come, is at most one read's
worth ahead of them.) An idle queue's six loops so cost about one read each per BLOCK_MS, not 20
reads and XINFOs a second (bench/tasks_idle.py).
"""
import redis

from shoal_common.text import to_text
from streams_app.redis.lag import find_group

# How long a yielding band waits before it asks again (seconds).
YIELD_SECONDS = 0.05


def waiting(conn, streams, group):
    """Whether any of ``streams`` holds entries not yet delivered to ``group``."""
    if not streams:
        return False
    pipe = conn.pipeline(transaction=False)
    for stream in streams:
        pipe.xinfo_groups(stream)
    for stream, reply in zip(streams, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, redis.ResponseError):
            continue  # no such stream yet: nothing waits there
        if isinstance(reply, Exception):
            raise reply
        # Matched without decoding: another client's group may be named in bytes that are not UTF-8.
        info = find_group(reply, group)
        if info is not None:
            lag = info.get("lag")
            if lag is None:  # Redis cannot tell (entries deleted): compare the ids instead
                lag = _behind(conn, stream, to_text(info.get("last-delivered-id")))
            if lag:
                return True
    return False


def _behind(conn, stream, last_delivered):
    last = to_text(conn.xinfo_stream(stream).get("last-generated-id"))
    return last != last_delivered


def higher_bands_idle(loop):
    """Whether every band above ``loop``'s is read in this process by a loop now blocked in a read that
    follows one that found nothing: then none of them holds unread entries (see the module's docstring)."""
    higher = [peer for peer in loop.peers if peer.group == loop.group and peer.stream in loop.spec.yields_to]
    return len(higher) == len(loop.spec.yields_to) and all(
        peer.reading and peer.read_nothing and not peer.busy_chunks for peer in higher)
