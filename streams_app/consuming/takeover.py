"""Taking entries over: the half of a GroupLoop's pass that does not read new entries.

``take_over`` hands out, in this order: this consumer's own failed entries whose back-off is over
(XCLAIM to itself, which redelivers and counts them), entries of consumers known dead (their
liveness deadline lapsed and no connection of theirs is left: no pending timeout to wait), and
entries of other consumers idle past the pending timeout and their back-off (XPENDING ... IDLE
pages). Entries at max_deliveries are queued for the dead-letter stream instead.

A base class of loop.GroupLoop, split out by role: these methods share the loop's retry heap, held
entries and claim cursor with its failure handling and the lost-group protocol (lost_group.py).
"""
import heapq
import logging

import redis

from shoal_common.redis_errors import is_no_permission
from shoal_common.text import to_text
from streams_app.redis.connection import node_client
from streams_app.consuming import liveness, runs
from streams_app.consuming.retry import backoff_seconds, claimable_idle_ms
from streams_app.deadletters import store as deadletters

logger = logging.getLogger("streams_app.consumer")

# Pending entries looked at per XPENDING page while searching for abandoned ones.
PENDING_PAGE = 200
# Dead consumers whose entries one claim pass looks at (the rest wait for the next pass).
DEAD_CONSUMERS_PER_PASS = 10

_str = to_text


class TakeOver:
    def take_over(self, capacity, now):
        """This consumer's failed entries whose back-off is over, then entries abandoned by others."""
        entries = self._due_retries(capacity, now)
        if not self.ready:  # the group was found lost: put back what is held before claiming anything
            return entries
        taken = []
        if len(entries) < capacity and self.claim_cursor is None and now >= self.next_claim:
            taken += self._claim_from_dead(capacity - len(entries), now)
        if len(entries) + len(taken) < capacity and (self.claim_cursor is not None or now >= self.next_claim):
            taken += self._claim_abandoned(capacity - len(entries) - len(taken), now)
        if taken and self.tracing is not None:
            self.tracing.took_over(taken)  # their spans say they were taken over
        return entries + taken

    def _claim_from_dead(self, room, now):
        """Entries of consumers known dead: no pending timeout to wait, only their retry back-off.

        Dead means both: its liveness deadline lapsed, and no connection of it is left on the
        server (CLIENT LIST; a killed process's sockets close, a frozen or paused one's do not).
        Right after this loop itself reconnected, nobody is judged: every deadline lapsed while
        Redis was away and the others may not have reconnected yet. Entries over their delivery
        limit are left to the pending-timeout path, which knows they are idle.
        """
        if now < self.judge_dead_after:
            return []
        lapsed = liveness.dead_consumers(self.conn, self.stream) - {self.consumer}
        if not lapsed:
            return []
        summary = self.conn.xpending(self.stream, self.group)
        # Shown name -> the bytes Redis holds: another client may read under a name that is not UTF-8,
        # and only those bytes find its entries (dead_consumers escapes it as \\xNN).
        holders = {_str(c["name"], errors="backslashreplace"): c["name"] for c in summary.get("consumers") or ()}
        candidates = lapsed & holders.keys()
        if not candidates:
            return []
        if not self.can_list_clients:
            return []
        try:
            # Client lists are per node: the readers of this stream are connected to its slot's node.
            connected = {c.get("name") for c in node_client(self.conn, self.stream).client_list()}
        except redis.ResponseError as exc:
            if not is_no_permission(exc):
                raise
            self.can_list_clients = False
            logger.warning("Consumer %s: the Redis user may not run CLIENT LIST (%s): consumers known dead are "
                           "not taken over at once; their entries are taken over after PENDING_TIMEOUT_MS", self.consumer, exc)
            return []
        dead = sorted(n for n in candidates if liveness.reader_client_name(n) not in connected)
        if self.guard is not None:
            self.guard.confirmed_dead = frozenset(dead)
        entries = []
        in_flight = self.in_flight
        for name in dead[:DEAD_CONSUMERS_PER_PASS]:
            rows = self.conn.xpending_range(self.stream, self.group, min="-", max="+", count=room - len(entries),
                                            consumername=holders[name])
            wanted = {}
            for row in rows:
                entry_id, deliveries = _str(row["message_id"]), row["times_delivered"]
                if entry_id in in_flight or (self.runs is None and deliveries >= self.max_deliveries):
                    continue
                if row["time_since_delivered"] >= int(backoff_seconds(deliveries, self.retry_base, self.retry_cap) * 1000):
                    wanted[entry_id] = deliveries
            if wanted:
                min_idle = int(backoff_seconds(1, self.retry_base, self.retry_cap) * 1000)
                got = self._claim(min_idle, {holders[name]: list(wanted)}, wanted)  # the bytes Redis holds
                if got:
                    logger.info("Consumer %s: took over %d entries of dead consumer %s on %s/%s",
                                self.consumer, len(got), name, self.stream, self.group)
                entries += got
            if len(entries) >= room:
                break
        return entries

    def _due_retries(self, capacity, now):
        due = []
        while self.retries and self.retries[0][0] <= now and len(due) < capacity:
            due.append(heapq.heappop(self.retries)[1:])
        if not due:
            return []
        # XCLAIM to itself redelivers (and counts) one entry. Its min idle is most of the back-off:
        # had another consumer claimed the entry meanwhile, its idle time would have been reset.
        pipe = self.conn.pipeline(transaction=False)
        for entry_id, deliveries in due:
            min_idle = int(backoff_seconds(deliveries, self.retry_base, self.retry_cap) * 900)
            # The run ledger (runs.py) keeps a pending entry's count at its runs + 1: set, not counted again.
            retrycount = deliveries + 1 if self.runs is not None else None
            pipe.xclaim(self.stream, self.group, self.consumer, min_idle, [entry_id], retrycount=retrycount)
        try:
            replies = pipe.execute()
        except BaseException:
            # Still due (a lost connection, or a lost group whose recreation makes them pending again).
            for entry_id, deliveries in due:
                heapq.heappush(self.retries, (now, entry_id, deliveries))
            raise
        entries, missing = [], []
        for (entry_id, deliveries), claimed in zip(due, replies):
            # Deleted from the stream: Redis drops it from the PEL and returns nothing. So it does when
            # another consumer claimed it meanwhile, or recreated the lost group (see lost_group.recreated_elsewhere).
            got = [(_str(i), f, deliveries + 1) for i, f in claimed if f]
            if not got:
                missing.append((now, entry_id, deliveries))
            entries.extend(got)
        if missing and self.lost_group.recreated_elsewhere():
            for retry in missing:
                heapq.heappush(self.retries, retry)  # the recreation puts them back, due as planned
        return entries

    def _claim_abandoned(self, room, now):
        """Claim entries of other consumers idle past the pending timeout and their back-off.

        Entries at or over max_deliveries are dead-lettered instead. XCLAIM's own min-idle check
        makes a race with another consumer safe: the loser's claim returns nothing.
        """
        rows = self.conn.xpending_range(
            self.stream, self.group, min=self.claim_cursor or "-", max="+", count=PENDING_PAGE,
            idle=self.pending_timeout_ms,
        )
        wanted = {}
        holders = {}
        last = None
        busy_here = None
        for row in rows:
            last = _str(row["message_id"])
            deliveries = row["times_delivered"]
            if busy_here is None:
                busy_here = self.in_flight
                waiting = {entry_id for _, entry_id, _ in self.retries}
            if last in busy_here:
                # Running or queued here, even if another consumer claimed it from us meanwhile:
                # claiming it back would run it a second time in this very process.
                continue
            if last in waiting and row["time_since_delivered"] < claimable_idle_ms(
                    deliveries, self.retry_base, self.retry_cap, self.pending_timeout_ms):
                continue  # its back-off here is not over
            # One waiting here yet idle past its back-off was made due by an operator (the admin's
            # "retry now" sets its idle time): taken now, and out of the retry heap. Our own entry that nothing here will retry (its retry XCLAIM found it too fresh, or its
            # chunk was lost) is treated like any abandoned entry.
            if self.runs is None and deliveries >= self.max_deliveries:
                self.to_dead_letter.append((last, deadletters.RECORDED_ERROR, ""))
            elif row["time_since_delivered"] >= claimable_idle_ms(deliveries, self.retry_base, self.retry_cap, self.pending_timeout_ms):
                wanted[last] = deliveries
                holders.setdefault(_str(row["consumer"]), []).append(last)
                if len(wanted) >= room:
                    break
        self.claim_cursor = "(" + last if last is not None and (len(rows) >= PENDING_PAGE or len(wanted) >= room) else None
        if self.claim_cursor is None:
            self.next_claim = now + self.claim_interval
        if not wanted:
            return []
        self._forget_retries(wanted)
        entries = self._claim(self.pending_timeout_ms, holders, wanted)
        if entries:
            logger.info("Consumer %s: took over %d abandoned entries of %s/%s", self.consumer, len(entries), self.stream, self.group)
        return entries

    def _claim(self, min_idle, holders, wanted):
        """XCLAIM the ``holders``' entries ({holder: ids}) for this consumer; (id, fields, deliveries) each.

        With the run ledger (runs.py) in one script that charges a run only to the entries their holder was
        running, queues those whose runs reached max_deliveries for the dead-letter stream instead, and notes
        the suspects: entries their holder was running when it stopped, maybe because of them. They run
        alone (alone.py), so one that kills its worker again is charged that death and nothing else is."""
        if self.runs is None:
            claimed = self.conn.xclaim(self.stream, self.group, self.consumer, min_idle, list(wanted))
            return [(_str(i), f, wanted.get(_str(i), 0) + 1) for i, f in claimed if f]
        claimed, over = runs.take_over(self.conn, self.stream, self.group, self.consumer, min_idle,
                                       self.max_deliveries, holders)
        self.to_dead_letter += [(entry_id, deadletters.RECORDED_ERROR, "") for entry_id in over]
        self.suspects.update(entry_id for entry_id, _, _, suspect in claimed if suspect)
        return [(entry_id, fields, count) for entry_id, fields, count, _ in claimed]

    def _forget_retries(self, entry_ids):
        if any(entry_id in entry_ids for _, entry_id, _ in self.retries):
            self.retries = [r for r in self.retries if r[1] not in entry_ids]
            heapq.heapify(self.retries)
