"""The lost-group protocol: a consumer group destroyed or flushed under its live consumers.

A group can vanish while its consumers run (XGROUP DESTROY, DEL of the stream, FLUSHALL/FLUSHDB,
a Redis restart without persistence). Recreated at its ``start`` ("0") it would hand the whole
stream out again and dead-letter its poison a second time. Each consumer knows only what it read
itself, so every live consumer takes part (docs/consuming.md, "A lost group is recreated where it
stood", says what is promised and what is not):

1. **Who notices.** An idle consumer at once: its blocked read gets NOGROUP or "UNBLOCKED the stream
   key no longer exists" (``noticed``). A busy one, which does not read, when entries it holds turn
   out not pending any more while the settling marker lives (``recreated_elsewhere``): its keep-alive
   (lua/keep_alive.lua counts the entries it kept), a dead-letter move (lua/dead_letter.lua reports
   them not pending), a retry's XCLAIM that returns nothing, or an empty read while it holds failed
   entries. Any consumer whose read is taken back (4.). A consumer that *starts* while the group is
   gone creates it at its ``start``, but the stream's set of groups (keys.groups_key) says the group
   existed: ``settle_recreated`` then marks it settling, so the running consumers move it forward.
2. **Who recreates, and where.** Every consumer that noticed runs lua/recreate_group.lua with its own
   last read id (``recreate``): the script creates the group there, or moves it forward to that id if
   another consumer created it further back. XREADGROUP ``>`` hands entries out in id order, so the
   group ends where the lost one stood: at the largest id any live consumer read.
3. **The settling marker** (keys.settling_key, ``{S}:settling:{G}``). When the stream still holds
   entries this consumer may have read (XGROUP DESTROY; after a flush only newer ids are left), the
   group is created with a marker that lives ``lost_group_settle_seconds``: one keep-alive period and
   one blocking read, the time every live consumer needs to notice (1.). Its value is the largest last
   read id reported so far. A consumer that recreated or moved the group reads nothing until both the
   settling time and the marker have passed (``read_after``; the loop's ``settling_now``).
4. **Take-back.** A read that hands out ids at or below this consumer's own last read (the group was
   recreated further back before it noticed), or any read while the marker lives, is not trusted
   (``takes_back``): none of it runs, lua/take_back_read.lua undoes it (the group goes back to just
   before the read, or to the marker's value if that is further on), and the consumer handles the loss
   as in 2.
5. **What each consumer puts back.** What it holds goes back into the recreated group's pending list
   with XCLAIM ... FORCE and its delivery count (``_hold_again``): entries running or queued for its
   handlers, failed ones waiting for their retry (idle for as long as since they failed), dead-letter
   moves not yet made. Their acks, retries, moves and takeover then work as before. Entries pending
   with consumers that died meanwhile are no longer tracked.

The read loop (loop.GroupLoop) owns one ``LostGroupProtocol`` and calls it at a few named points:
``noticed`` when a command says the group is gone, ``recreate`` when it makes the group ready again,
``takes_back`` on every read, ``recreated_elsewhere`` when entries it holds are found not pending,
and ``read_after`` before it reads.
"""
import logging

import redis

from shoal_common.redis_errors import is_oom
from shoal_common.text import to_text
from streams_app.redis import keys, scripts
from streams_app.consuming.retry import KEEP_ALIVE_FRACTION, backoff_seconds
from streams_app.redis.entry_ids import id_key

logger = logging.getLogger("streams_app.consumer")

# A group recreated on a stream that still holds entries is not read for this many keep-alive periods
# plus blocks (and a second): the time every live consumer needs to find it gone and move it forward.
LOST_GROUP_SETTLE = 1

LOST_GROUP_OUTCOMES = {"created": "recreated", "advanced": "moved forward", "kept": "already recreated; kept"}


def lost_group_settle_seconds(pending_timeout_ms=None, block_ms=None):
    """How long a lost group settles: every live consumer of it finds it gone within one keep-alive
    (busy) or one read (idle). Settings' values unless given."""
    if pending_timeout_ms is None or block_ms is None:
        from streams_app.conf import get_settings

        config = get_settings()
        pending_timeout_ms, block_ms = config["PENDING_TIMEOUT_MS"], config["BLOCK_MS"]
    return LOST_GROUP_SETTLE * (pending_timeout_ms / 1000 / KEEP_ALIVE_FRACTION + block_ms / 1000) + 1.0


def settle_recreated(conn, stream, group, start):
    """A starting consumer just made a group that existed before: lost under consumers that may still
    run (busy ones learn of a loss only at their keep-alive or next read). Its settling marker makes
    every read while it lives be taken back, and makes those consumers move the group forward to what
    they read and put back what they hold (see recreate_group.lua), as if one of them had recreated it;
    without it they would not notice, and the entries they had read would be delivered again."""
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


class LostGroupProtocol:
    """One GroupLoop's part in the protocol. It reads the loop's state (what it read and holds) when
    called, so what the loop reassigns (its retry heap, its queued moves) is always current."""

    def __init__(self, loop):
        self.loop = loop
        self.settling = keys.settling_key(loop.stream, loop.group)
        self.settle_seconds = lost_group_settle_seconds(loop.pending_timeout_ms, loop.block_ms)
        self.lost = False  # the group vanished while consuming: recreate it with recreate(), not at start
        self.read_after = 0.0  # a recreated group is not read before then (see recreate)

    def noticed(self, exc):
        """The group vanished under the loop: FLUSHALL/FLUSHDB, DEL of the stream, XGROUP DESTROY, or a
        Redis restart without persistence. The loop's next pass recreates it where it stood (``recreate``).

        A group destroyed on a stream that still holds its entries would otherwise be recreated at
        ``start`` ("0"): the whole stream handled again and its poison dead-lettered a second time.
        What this consumer held is made pending again (``_hold_again``); entries that were pending
        with a consumer that died are no longer tracked.
        """
        loop = self.loop
        loop.ready = False
        self.lost = True
        if loop.last_read_id is None:
            logger.warning("Consumer %s: group %s on %s is gone (%s); recreating it from %s",
                           loop.consumer, loop.group, loop.stream, exc, loop.spec.start)
            return
        logger.error("Consumer %s: group %s on %s vanished while consuming (%s): flushed, deleted or XGROUP "
                     "DESTROYed. Recreating it where it stood (the last entry this or any other live consumer "
                     "of it read; this one read up to %s), so nothing is handled twice; what it holds stays "
                     "pending, entries that were pending with consumers that died are no longer tracked.",
                     loop.consumer, loop.group, loop.stream, exc, loop.last_read_id)

    def recreate(self, now):
        """Recreate the lost group where it stood (recreate_lost_group); when the stream still holds
        entries this consumer may have read, read nothing for ``settle_seconds``: every live consumer
        of the group finds it gone within that time (an idle one at once: Redis unblocks its read; a
        busy one at its next keep-alive) and moves it forward to what it read."""
        loop = self.loop
        start = loop.last_read_id or loop.spec.start
        what, settle = recreate_lost_group(loop.conn, loop.stream, loop.group, loop.last_read_id, loop.spec.start,
                                           self.settle_seconds * 1000)
        # Not before the settling marker lapses either, settling here or not: a read while it lives is
        # taken back, and the group lost again (after a flush the stream holds only newer entries, so
        # this consumer need not settle, but the marker is set all the same: reading at once went
        # read, take back, recreate, read... in a tight loop, with four log lines a turn, until it lapsed).
        marker_left = loop.conn.pttl(self.settling) / 1000
        wait = max(self.settle_seconds if settle else 0.0, marker_left + 0.05 if marker_left > 0 else 0.0)
        if wait:
            self.read_after = now + wait
        self._hold_again()
        logger.warning("Consumer %s: group %s on %s %s at %s%s", loop.consumer, loop.group, loop.stream, what, start,
                       f"; reading again in {wait:.1f} s, when every live consumer has moved it "
                       "to what it read" if wait else "")

    def _hold_again(self):
        """Put what this consumer holds back into the recreated group's pending list (XCLAIM … FORCE,
        with its delivery count): entries running or queued here, failed ones waiting for their retry,
        dead-letter moves not yet made. Their acks, retries, moves and (if this process dies) takeover
        then work as before; only entries held by consumers that died meanwhile stay untracked.
        Entries no longer in the stream (a flush) are skipped by Redis."""
        loop = self.loop
        held = {m.id: (m.deliveries, 0) for chunk in list(loop.chunks.values()) for m in chunk}
        # A failed entry is put back idle for as long as it has been since it failed: due here as planned,
        # and claimable by other consumers no sooner than before the loss (idle for a whole back-off,
        # it was taken over and run at once elsewhere, and this consumer's retry ran it again).
        now = loop.clock()
        pending = 1 if loop.runs is not None else 0  # the run ledger's count of a failed entry is its runs + 1
        held.update((entry_id, (deliveries + pending, int(max(0.0, backoff_seconds(deliveries, loop.retry_base, loop.retry_cap)
                                                    - max(0.0, due - now)) * 1000)))
                    for due, entry_id, deliveries in loop.retries)
        held.update((entry_id, (loop.max_deliveries, 0)) for entry_id, _, _ in loop.to_dead_letter)
        if not held:
            return
        pipe = loop.conn.pipeline(transaction=False)
        for entry_id, (deliveries, idle) in held.items():
            pipe.xclaim(loop.stream, loop.group, loop.consumer, 0, [entry_id], idle=idle, retrycount=deliveries,
                        force=True, justid=True)
        pipe.execute()
        logger.warning("Consumer %s: %d entries it held are pending again in %s/%s", loop.consumer, len(held),
                       loop.stream, loop.group)

    def takes_back(self, entries, settling=None):
        """Whether a group read must not run: it is behind this consumer's last read, or comes while the
        group settles; such a read is taken back (``_take_back``). ``settling``: whether the marker
        existed right after the read, when that read asked (else None: asked here)."""
        loop = self.loop
        if not entries:
            # A group recreated by another consumer at the stream's end hands out nothing to tell this one
            # so; had it not been blocked in a read at the loss (it was busy then), the failed entries and
            # dead-letter moves it holds would find themselves not pending once the marker lapsed.
            if (loop.retries or loop.to_dead_letter) and (settling is None or settling):  # None: not asked
                self.recreated_elsewhere()
            return False
        behind = loop.last_read_id is not None and id_key(entries[0][0]) <= id_key(loop.last_read_id)
        if behind or (loop.conn.exists(self.settling) if settling is None else settling):
            self._take_back(entries)
            return True
        return False

    def _take_back(self, entries):
        """A read handed out ids at or below this consumer's own last read: a group lives on ``>`` in
        id order, so it was lost and another consumer recreated it further back before this one
        noticed (its keep-alive had not run yet). Nothing of the read runs: lua/take_back_read.lua
        takes it back, and the loop treats the group as lost (moves it forward to its own last read,
        settles, puts back what it holds), as if it had seen NOGROUP."""
        loop = self.loop
        ids = [entry_id for entry_id, _, _ in entries]
        what, kept = scripts.run(loop.conn, "take_back_read", [loop.stream, self.settling],
                                 [loop.group, loop.consumer, loop.last_read_id or "0-0", *ids])
        logger.error("Consumer %s: group %s on %s read back %d entries from %s, at or below what this consumer "
                     "had already read (%s) or while the group settles: the group was lost and recreated. None "
                     "of them runs here (%s%s).", loop.consumer, loop.group, loop.stream, len(ids), ids[0], loop.last_read_id,
                     "read undone" if to_text(what) == "undone" else to_text(what),
                     f"; {kept} entries above {loop.last_read_id} stay pending to be taken over" if kept else "")
        self.noticed(f"read back {ids[0]}")

    def recreated_elsewhere(self):
        """Entries held here are no longer pending in the group: acked or taken by another consumer, or
        the group was lost and another one recreated it before this one noticed. A busy consumer does not
        notice: its keep-alive and moves find a group, and it does not read. While the settling marker
        lives it is the latter, unless this consumer already handled that loss (it reads nothing until
        the marker lapses): handle it now, as if NOGROUP had come. True then."""
        if self.loop.clock() < self.read_after or not self.loop.conn.exists(self.settling):
            return False
        self.noticed("entries it held were no longer pending in it: another consumer recreated it first")
        return True
