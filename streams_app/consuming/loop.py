"""The read loop of one consumer group inside one worker process.

One pass of the loop is ``tick()``: collect finished handlers, ack them in one XACK, record
failures (last errors, dead-letter moves) in one pipeline, then either take over entries (this
consumer's own failed ones whose back-off has passed, and entries abandoned by other consumers)
or read new entries (XREADGROUP ``>``), and hand them to the handler threads. Reads are sized by
free handler slots, so a worker never hoards entries it cannot start soon: hoarded entries would
look abandoned to other consumers after the pending timeout and be handled twice.

Retries: a failed entry stays pending and goes on a heap keyed by when its back-off ends; it is
redelivered with XCLAIM by this consumer then. Entries of other consumers are found with
XPENDING ... IDLE (idle time and delivery count) and claimed only when idle past both the pending
timeout and their back-off, so a message that kills its worker is not retried in a hot loop.
At max_deliveries, or at once for undecodable input, an entry is moved to ``{S}:dlq``.
"""
import heapq
import logging
import queue
import time

import redis

from shoal_common.backoff import backoff_delay
from shoal_common.text import to_text
from streams_app import scripts

from streams_app.deadletters import store as deadletters

from streams_app.consuming import liveness

from streams_app.metrics import consumer as metrics
from shoal_common.redis_errors import is_lost_group, is_no_permission, is_oom, is_unblocked
from streams_app.connection import TRANSIENT_ERRORS, is_cluster, node_client, recover, slot_pipeline
from streams_app.consuming import refusals
from streams_app.consuming.chunks import run_chunk, run_chunk_async
from streams_app.consuming.outage import OutageLog
from streams_app.consuming.outcomes import Outcome, Status
from streams_app.consuming.groups import ensure_group, recreate_lost_group
from streams_app.consuming.idempotency import DuplicateInFlight, make_guard
from streams_app.keys import dead_letter_key, settling_key
from streams_app.message import Message
from streams_app.entry_ids import id_key
from streams_app.consuming.retry import backoff_policy, backoff_seconds, claimable_idle_ms

logger = logging.getLogger("streams_app.consumer")

# When handlers are in flight a read blocks only briefly, so their acks are not held back.
BUSY_BLOCK_MS = 50
# Aim for chunks of about this much handler time: big enough to amortise the hand-off to a
# thread for fast handlers, one message at a time for slow ones.
CHUNK_TARGET_SECONDS = 0.005
# Pending entries looked at per XPENDING page while searching for abandoned ones.
PENDING_PAGE = 200
# Dead consumers whose entries one claim pass looks at (the rest wait for the next pass).
DEAD_CONSUMERS_PER_PASS = 10
# Held entries are kept alive (their idle time reset) this often, as a fraction of the pending
# timeout, and reads are bounded to what the threads can start within this fraction of it.
KEEP_ALIVE_FRACTION = 4
# Entries per keep-alive script run: keeps one run short, so it does not stall other clients.
KEEP_ALIVE_BATCH = 500
# A group recreated on a stream that still holds entries is not read for this many keep-alive periods
# plus blocks (and a second): the time every live consumer needs to find it gone and move it forward.
LOST_GROUP_SETTLE = 1
# How long dead-letter moves Redis refused (maxmemory) wait before they are tried again.
REFUSED_RETRY_SECONDS = 1.0


def lost_group_settle_seconds(pending_timeout_ms=None, block_ms=None):
    """How long a lost group settles: every live consumer of it finds it gone within one keep-alive
    (busy) or one read (idle). Settings' values unless given."""
    if pending_timeout_ms is None or block_ms is None:
        from streams_app.conf import get_settings

        config = get_settings()
        pending_timeout_ms, block_ms = config["PENDING_TIMEOUT_MS"], config["BLOCK_MS"]
    return LOST_GROUP_SETTLE * (pending_timeout_ms / 1000 / KEEP_ALIVE_FRACTION + block_ms / 1000) + 1.0


_str = to_text


class GroupLoop:
    def __init__(self, spec, consumer, *, conn, reader, executor, threads, shutdown, config, clock=time.monotonic,
                 concurrency=None, outage=None):
        self.spec = spec
        self.stream = spec.stream
        self.group = spec.group
        self.consumer = consumer
        self.conn = conn
        self.reader = reader
        self.executor = executor
        self.shutdown = shutdown
        self.clock = clock
        self.batch = spec.batch or config["BATCH_SIZE"]
        self.block_ms = config["BLOCK_MS"]
        self.pending_timeout_ms = config["PENDING_TIMEOUT_MS"]
        self.claim_interval = config["CLAIM_INTERVAL_MS"] / 1000
        self.backoff_max = config["RECONNECT_BACKOFF_MAX"]
        self.max_deliveries = spec.max_deliveries
        self.retry_base, self.retry_cap = backoff_policy(spec, config)
        self.error_ttl = config["ERROR_TTL"]
        self.guard = make_guard(spec, conn, config)
        # A chunk stops starting messages after this long (see run_chunk): well inside the pending
        # timeout, so finished entries are acked long before anyone could take them over.
        self.chunk_budget = min(1.0, self.pending_timeout_ms / 1000 / 10)
        self.threads = threads
        if spec.is_async:
            # ``executor`` is the worker's EventLoopRunner: one coroutine per message, as many in
            # flight as the concurrency bound. No chunking: a chunk's messages would be awaited one
            # after the other, and the hand-off to the loop costs little next to an await.
            self.run_chunk = run_chunk_async
            self.slots = concurrency or threads
            self.max_chunk = 1
        else:
            self.run_chunk = run_chunk
            self.slots = 2 * threads
            self.max_chunk = max(1, -(-self.batch // threads))
        self.keep_alive_every = self.pending_timeout_ms / 1000 / KEEP_ALIVE_FRACTION
        self.next_keep_alive = 0.0
        self.last_read_id = None  # where to recreate a group lost while consuming (see _recreate)
        self.lost = False  # the group vanished while consuming: recreate it with _recreate, not at start
        self.read_after = 0.0  # a recreated group is not read before then (see _recreate)
        self.settling = settling_key(self.stream, self.group)
        self.settle_seconds = lost_group_settle_seconds(self.pending_timeout_ms, self.block_ms)
        self.moves_due = 0.0  # dead-letter moves Redis refused wait until then
        self.can_list_clients = True  # False for a Redis user without CLIENT LIST (see _claim_from_dead)
        self.chunk_size = 1
        self.seconds_per_message = None
        # Acks, read and settling check in one pipeline (_ack_and_read). Not on a cluster: a plain
        # pipeline on the stream's node would not follow a moved slot as the cluster client does.
        self.one_round_trip = not is_cluster(reader)

        self.chunks = {}  # future -> the messages it is handling
        self.completions = queue.SimpleQueue()
        self.to_ack = []
        self.ready = False
        self.next_claim = 0.0
        self.claim_cursor = None  # XPENDING scan for abandoned entries in progress
        self.retries = []  # heap of (due, entry id, deliveries so far) of this consumer's failed entries
        self.errors = []  # (id, error, traceback) to record as last errors
        self.to_dead_letter = []  # (id, error, traceback) to move to the dead-letter stream
        self.dead_lettered = 0
        self.reading = False  # inside a blocking XREADGROUP (shutdown unblocks it)
        self.failures = 0
        self.outage = outage if outage is not None else OutageLog()  # the worker's, shared by its loops
        self.handled = 0
        self.consumer_ttl = config["CONSUMER_TTL"]
        self.judge_dead_after = 0.0  # see _claim_from_dead

    @property
    def busy_chunks(self):
        return len(self.chunks)

    @property
    def in_flight(self):
        """Ids handed to handler threads and not yet collected (built on demand: off the hot path)."""
        return {m.id for chunk in self.chunks.values() for m in chunk}

    # -- the loop ---------------------------------------------------------------------------

    def run(self):
        while not self.shutdown.is_set():
            self.step()
        self.drain()

    def step(self):
        """One pass that survives Redis trouble: back off on connection errors, remake a lost group."""
        try:
            self.tick()
            self._redis_ok()
        except TRANSIENT_ERRORS as exc:
            self._redis_down(exc)
        except redis.ResponseError as exc:
            if is_oom(exc):
                # At maxmemory: only a missing group's creation gets here (reads and acks work).
                refusals.refused("group", exc)
                self.shutdown.wait(REFUSED_RETRY_SECONDS)
                return
            # "UNBLOCKED the stream key no longer exists" is a lost group; any other UNBLOCKED means
            # the node of a blocked read became a replica: a failover.
            if is_unblocked(exc) and not is_lost_group(exc):
                self._redis_down(exc)
                return
            if not is_lost_group(exc):
                raise
            self._group_lost(exc)

    def _group_lost(self, exc):
        """The group vanished under the loop: FLUSHALL/FLUSHDB, DEL of the stream, XGROUP DESTROY, or a
        Redis restart without persistence. Recreate it where it stood (see ``_recreate``).

        A group destroyed on a stream that still holds its entries would otherwise be recreated at
        ``start`` ("0"): the whole stream handled again and its poison dead-lettered a second time.
        What this consumer held is made pending again (``_hold_again``); entries that were pending
        with a consumer that died are no longer tracked.
        """
        self.ready = False
        self.lost = True
        if self.last_read_id is None:
            logger.warning("Consumer %s: group %s on %s is gone (%s); recreating it from %s",
                           self.consumer, self.group, self.stream, exc, self.spec.start)
            return
        logger.error("Consumer %s: group %s on %s vanished while consuming (%s): flushed, deleted or XGROUP "
                     "DESTROYed. Recreating it where it stood (the last entry this or any other live consumer "
                     "of it read; this one read up to %s), so nothing is handled twice; what it holds stays "
                     "pending, entries that were pending with consumers that died are no longer tracked.",
                     self.consumer, self.group, self.stream, exc, self.last_read_id)

    def _recreate(self, now):
        """Recreate the lost group where it stood (groups.recreate_lost_group); when the stream still
        holds entries this consumer may have read, read nothing for ``settle_seconds``: every live
        consumer of the group finds it gone within that time (an idle one at once: Redis unblocks its
        read; a busy one at its next keep-alive) and moves it forward to what it read."""
        start = self.last_read_id or self.spec.start
        what, settle = recreate_lost_group(self.conn, self.stream, self.group, self.last_read_id, self.spec.start,
                                           self.settle_seconds * 1000)
        if settle:
            # Not before the settling marker lapses either: a read while it lives is taken back.
            self.read_after = now + max(self.settle_seconds, self.conn.pttl(self.settling) / 1000 + 0.05)
        self._hold_again()
        logger.warning("Consumer %s: group %s on %s %s at %s%s", self.consumer, self.group, self.stream, what, start,
                       f"; reading again in {self.settle_seconds:.1f} s, when every live consumer has moved it "
                       "to what it read" if settle else "")

    def _hold_again(self):
        """Put what this consumer holds back into the recreated group's pending list (XCLAIM … FORCE,
        with its delivery count): entries running or queued here, failed ones waiting for their retry,
        dead-letter moves not yet made. Their acks, retries, moves and (if this process dies) takeover
        then work as before; only entries held by consumers that died meanwhile stay untracked.
        Entries no longer in the stream (a flush) are skipped by Redis."""
        held = {m.id: (m.deliveries, 0) for chunk in list(self.chunks.values()) for m in chunk}
        # A failed entry is put back idle for as long as it has been since it failed: due here as planned,
        # and claimable by other consumers no sooner than before the loss (idle for a whole back-off,
        # it was taken over and run at once elsewhere, and this consumer's retry ran it again).
        now = self.clock()
        held.update((entry_id, (deliveries, int(max(0.0, backoff_seconds(deliveries, self.retry_base, self.retry_cap)
                                                    - max(0.0, due - now)) * 1000)))
                    for due, entry_id, deliveries in self.retries)
        held.update((entry_id, (self.max_deliveries, 0)) for entry_id, _, _ in self.to_dead_letter)
        if not held:
            return
        pipe = self.conn.pipeline(transaction=False)
        for entry_id, (deliveries, idle) in held.items():
            pipe.xclaim(self.stream, self.group, self.consumer, 0, [entry_id], idle=idle, retrycount=deliveries,
                        force=True, justid=True)
        pipe.execute()
        logger.warning("Consumer %s: %d entries it held are pending again in %s/%s", self.consumer, len(held),
                       self.stream, self.group)

    def tick(self, now=None):
        now = self.clock() if now is None else now
        if not self.ready:
            self.make_ready(now)
        self.collect()
        self.flush_failures()
        if not self.ready:  # flush_failures found the group recreated by another consumer: put back first
            return
        self.keep_alive(now)
        if not self.ready:  # or the keep-alive did
            return
        # Acks go out before anything that may wait; on the way to a read they ride in its round trip.
        if self.settling_now(now):
            return
        free = self.slots - self.busy_chunks
        room = self._time_room()
        if self.busy_chunks and (free < max(1, self.slots // 2) or room < 1):
            self.flush_acks()
            self.collect(timeout=min(1.0, self.block_ms / 1000, self.keep_alive_every))
            self.flush_failures()
            return  # what this collected is acked by the next pass, at once: with its read if it reads
        capacity = max(1, min(self.batch, free * self.chunk_size, room))
        next_retry = self.retries[0][0] if self.retries else float("inf")
        if self.claim_cursor is not None or now >= self.next_claim or now >= next_retry:
            self.flush_acks()
            entries = self.take_over(capacity, now)
            if entries:
                self.dispatch(entries)
                return
        if self.busy_chunks:
            block = BUSY_BLOCK_MS
        else:
            block = min(self.block_ms, max(1, int((min(self.next_claim, next_retry) - now) * 1000)))
        self.dispatch(self.read_new(capacity, block))

    def make_ready(self, now):
        """Create the group at ``start``, or, once it was lost while consuming, where it stood (_recreate)."""
        if self.lost:
            self._recreate(now)
        elif ensure_group(self.conn, self.stream, self.group, self.spec.start):
            logger.info("Consumer %s: created group %s on %s at %s", self.consumer, self.group, self.stream,
                        self.spec.start)
        self.ready = True

    def settling_now(self, now):
        """A lost group settling (see _recreate): finish and ack, read nothing; True while it does."""
        if now >= self.read_after:
            return False
        self.flush_acks()
        self.collect(timeout=min(0.2, self.read_after - now))
        return True

    # -- reading ----------------------------------------------------------------------------

    def read_new(self, count, block_ms):
        """New entries (XREADGROUP ``>``), after acking what is due; taken back if the group was lost."""
        self.reading = True
        try:
            if self.shutdown.is_set():
                self.flush_acks()
                return []
            if self.one_round_trip:
                reply, settling = self._ack_and_read(count, block_ms)
            else:
                self.flush_acks()
                reply = self.reader.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
                settling = None
        finally:
            self.reading = False
        entries = [(_str(entry_id), fields, 1) for _, entries in reply or () for entry_id, fields in entries]
        return self.trusted(entries, settling)

    def trusted(self, entries, settling=None):
        """What of a group read may run: nothing when the read is behind this consumer's last read or
        comes while the group settles (taken back, see _read_back); else all of it, noted as read.
        ``settling``: whether the marker existed right after the read, when that read asked (else None)."""
        if not entries:
            # A group recreated by another consumer at the stream's end hands out nothing to tell this one
            # so; had it not been blocked in a read at the loss (it was busy then), the failed entries and
            # dead-letter moves it holds would find themselves not pending once the marker lapsed.
            if (self.retries or self.to_dead_letter) and (settling is None or settling):  # None: not asked
                self._recreated_elsewhere()
            return entries
        behind = self.last_read_id is not None and id_key(entries[0][0]) <= id_key(self.last_read_id)
        if behind or (self.conn.exists(self.settling) if settling is None else settling):
            self._read_back(entries)
            return []
        self.last_read_id = entries[-1][0]
        return entries

    def _ack_and_read(self, count, block_ms):
        """XACK of what is due, XREADGROUP, EXISTS of the settling marker: one round trip on one server.

        The server runs them in order: the acks land before the read blocks, and the marker is looked
        at right after the read, as a separate EXISTS would (recreate_group.lua makes the group and the
        marker in one step, so a read on a recreated group always sees it). Returns (reply, settling).
        """
        acks = self.to_ack
        pipe = self.reader.pipeline(transaction=False)
        if acks:
            pipe.xack(self.stream, self.group, *acks)
        pipe.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        pipe.exists(self.settling)
        replies = pipe.execute(raise_on_error=False)
        if acks and not isinstance(replies[0], Exception):
            self._acked(len(acks))
        error = next((r for r in replies if isinstance(r, Exception)), None)
        if error is not None:
            raise error  # NOGROUP, UNBLOCKED...: step() handles them as for a plain command
        return replies[-2], replies[-1]

    def _read_back(self, entries):
        """A read handed out ids at or below this consumer's own last read: a group lives on ``>`` in
        id order, so it was lost and another consumer recreated it further back before this one
        noticed (its keep-alive had not run yet). Nothing of the read runs: lua/take_back_read.lua
        takes it back, and the loop treats the group as lost (moves it forward to its own last read,
        settles, puts back what it holds), as if it had seen NOGROUP."""
        ids = [entry_id for entry_id, _, _ in entries]
        what, kept = scripts.run(self.conn, "take_back_read", [self.stream, self.settling],
                                 [self.group, self.consumer, self.last_read_id or "0-0", *ids])
        logger.error("Consumer %s: group %s on %s read back %d entries from %s, at or below what this consumer "
                     "had already read (%s) or while the group settles: the group was lost and recreated. None "
                     "of them runs here (%s%s).", self.consumer, self.group, self.stream, len(ids), ids[0], self.last_read_id,
                     "read undone" if to_text(what) == "undone" else to_text(what),
                     f"; {kept} entries above {self.last_read_id} stay pending to be taken over" if kept else "")
        self._group_lost(f"read back {ids[0]}")

    def _time_room(self):
        """How many more entries the threads can start within a fraction of the pending timeout.

        Reads are bounded by time as well as by free slots: chunk sizes follow past handler speed, so
        after fast traffic a read could take hundreds of entries that slow handlers will not start for
        minutes. Whatever is held anyway (handlers slow down after the read) is kept alive.
        """
        if self.seconds_per_message is None:
            return self.batch
        horizon = self.pending_timeout_ms / 1000 / KEEP_ALIVE_FRACTION
        parallel = self.slots if self.spec.is_async else self.threads  # coroutines, or handler threads
        startable = int(parallel * horizon / max(self.seconds_per_message, 1e-7))
        return max(parallel, startable) - self.held

    @property
    def held(self):
        return sum(len(chunk) for chunk in self.chunks.values())

    def keep_alive(self, now):
        """Reset the idle time of every entry this loop holds (running or queued for a thread).

        Idle time in the PEL is what other consumers and the reclaim daemon read as "abandoned": a
        handler slower than the pending timeout, or entries queued behind slow ones, must not look
        so while this process is alive. Renewed every quarter of the pending timeout; a frozen or
        partitioned process stops renewing and is taken over as before. The redis guard's running
        marks of the same entries are renewed with them, so a mark lasts as long as its holder.
        """
        if not self.chunks:
            self.next_keep_alive = now + self.keep_alive_every  # what is read next is fresh
            return
        if now < self.next_keep_alive:
            return
        self.next_keep_alive = now + self.keep_alive_every
        messages = [m for chunk in list(self.chunks.values()) for m in chunk]
        marks = getattr(self.guard, "mark_key", None)
        kept = 0
        for start in range(0, len(messages), KEEP_ALIVE_BATCH):
            batch = messages[start : start + KEEP_ALIVE_BATCH]
            script_keys = [self.stream] + ([marks(m) for m in batch] if marks else [])
            kept += int(scripts.run(self.conn, "keep_alive", script_keys,
                                    [self.group, self.consumer, self.guard.running_ms if marks else 0,
                                     *(m.id for m in batch)]))
        # A consumer whose threads are all busy does not read, so no NOGROUP tells it that its group was
        # lost and another consumer already recreated it (further back, at what that one read): its
        # running entries simply are not pending any more. Unnoticed past the settling time, the
        # recreated group would hand them out again while they run here.
        if kept < len(messages):
            self._recreated_elsewhere()

    def take_over(self, capacity, now):
        """This consumer's failed entries whose back-off is over, then entries abandoned by others."""
        entries = self._due_retries(capacity, now)
        if not self.ready:  # the group was found lost: put back what is held before claiming anything
            return entries
        if len(entries) < capacity and self.claim_cursor is None and now >= self.next_claim:
            entries += self._claim_from_dead(capacity - len(entries), now)
        if len(entries) < capacity and (self.claim_cursor is not None or now >= self.next_claim):
            entries += self._claim_abandoned(capacity - len(entries), now)
        return entries

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
        holders = {_str(c["name"]) for c in summary.get("consumers") or ()}
        candidates = lapsed & holders
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
                                            consumername=name)
            wanted = {}
            for row in rows:
                entry_id, deliveries = _str(row["message_id"]), row["times_delivered"]
                if entry_id in in_flight or deliveries >= self.max_deliveries:
                    continue
                if row["time_since_delivered"] >= int(backoff_seconds(deliveries, self.retry_base, self.retry_cap) * 1000):
                    wanted[entry_id] = deliveries
            if wanted:
                min_idle = int(backoff_seconds(1, self.retry_base, self.retry_cap) * 1000)
                claimed = self.conn.xclaim(self.stream, self.group, self.consumer, min_idle, list(wanted))
                got = [(_str(i), f, wanted.get(_str(i), 0) + 1) for i, f in claimed if f]
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
            pipe.xclaim(self.stream, self.group, self.consumer, min_idle, [entry_id])
        try:
            replies = pipe.execute()
        except BaseException:
            # Still due (a lost connection, or a lost group that _hold_again makes pending again).
            for entry_id, deliveries in due:
                heapq.heappush(self.retries, (now, entry_id, deliveries))
            raise
        entries, missing = [], []
        for (entry_id, deliveries), claimed in zip(due, replies):
            # Deleted from the stream: Redis drops it from the PEL and returns nothing. So it does when
            # another consumer claimed it meanwhile, or recreated the lost group (see _recreated_elsewhere).
            got = [(_str(i), f, deliveries + 1) for i, f in claimed if f]
            if not got:
                missing.append((now, entry_id, deliveries))
            entries.extend(got)
        if missing and self._recreated_elsewhere():
            for retry in missing:
                heapq.heappush(self.retries, retry)  # _hold_again puts them back, due as planned
        return entries

    def _recreated_elsewhere(self):
        """Entries held here are no longer pending in the group: acked or taken by another consumer, or
        the group was lost and another one recreated it before this one noticed. A busy consumer does not
        notice: its keep-alive and moves find a group, and it does not read. While the settling marker
        lives it is the latter, unless this consumer already handled that loss (it reads nothing until
        the marker lapses): handle it now, as if NOGROUP had come. True then."""
        if self.clock() < self.read_after or not self.conn.exists(self.settling):
            return False
        self._group_lost("entries it held were no longer pending in it: another consumer recreated it first")
        return True

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
            if deliveries >= self.max_deliveries:
                self.to_dead_letter.append((last, deadletters.RECORDED_ERROR, ""))
            elif row["time_since_delivered"] >= claimable_idle_ms(deliveries, self.retry_base, self.retry_cap, self.pending_timeout_ms):
                wanted[last] = deliveries
                if len(wanted) >= room:
                    break
        self.claim_cursor = "(" + last if last is not None and (len(rows) >= PENDING_PAGE or len(wanted) >= room) else None
        if self.claim_cursor is None:
            self.next_claim = now + self.claim_interval
        if not wanted:
            return []
        self._forget_retries(wanted)
        claimed = self.conn.xclaim(self.stream, self.group, self.consumer, self.pending_timeout_ms, list(wanted))
        entries = [(_str(i), f, wanted.get(_str(i), 0) + 1) for i, f in claimed if f]
        if entries:
            logger.info("Consumer %s: took over %d abandoned entries of %s/%s", self.consumer, len(entries), self.stream, self.group)
        return entries

    def _forget_retries(self, entry_ids):
        if any(entry_id in entry_ids for _, entry_id, _ in self.retries):
            self.retries = [r for r in self.retries if r[1] not in entry_ids]
            heapq.heapify(self.retries)

    # -- handing to threads and collecting --------------------------------------------------

    def dispatch(self, entries):
        if not entries:
            return
        self._submit([Message(i, self.stream, self.group, f, d, self.consumer) for i, f, d in entries])

    def _submit(self, messages):
        size = self.chunk_size
        chunks = [messages[start : start + size] for start in range(0, len(messages), size)]
        argsets = [(self.spec.handler, chunk, self.guard, self.chunk_budget) for chunk in chunks]
        submit_many = getattr(self.executor, "submit_many", None)  # the event loop: one wake-up for all
        if submit_many is not None:
            futures = submit_many(self.run_chunk, argsets)
        else:
            futures = [self.executor.submit(self.run_chunk, *args) for args in argsets]
        for future, chunk in zip(futures, chunks):
            self.chunks[future] = chunk
            future.add_done_callback(self.completions.put)

    def collect(self, timeout=0.0):
        """Take in finished chunks; wait up to ``timeout`` seconds for the first one."""
        try:
            future = self.completions.get(timeout=timeout) if timeout else self.completions.get_nowait()
        except queue.Empty:
            return
        while True:
            self._finish(future)
            try:
                future = self.completions.get_nowait()
            except queue.Empty:
                return

    def _finish(self, future):
        chunk = self.chunks.pop(future)
        try:
            result = future.result()
        except BaseException as exc:  # run_chunk catches handler errors; this is a bug, a guard's Redis error or a cancel
            if is_oom(exc):  # the redis guard cannot set its marks at maxmemory: run these later
                refusals.refused("idempotency", exc)
                self._not_run(chunk)
                return
            logger.exception("Consumer %s: a handler chunk of %s/%s failed outside its handler", self.consumer, self.stream, self.group)
            # A failed delivery like any other, so even an error outside the handler that repeats
            # on every delivery ends in the dead-letter stream at max_deliveries, not in a loop.
            for message in chunk:
                self.on_failure(Outcome(message, Status.FAILED, exc))
            return
        self._adapt_chunk(result.seconds_per_message)
        self.to_ack.extend(result.acked)
        for outcome in result.failed:
            self.on_failure(outcome)
        if result.unrun:
            self._not_run(result.unrun)  # waited behind a failure: that delivery must not count
        if result.left:
            self._submit(result.left)  # still ours in the PEL; the smaller chunk size now applies

    def on_failure(self, outcome):
        """Poison or out of deliveries: dead-letter. Otherwise record the error and retry after a back-off."""
        message = outcome.message
        if isinstance(outcome.error, DuplicateInFlight):
            self._not_run([message])  # another consumer runs the same key: this delivery ran nothing
            return
        poison = outcome.status is Status.POISON
        error, traceback = deadletters.describe(outcome.error, poison=poison)
        if poison or message.deliveries >= self.max_deliveries:
            self.to_dead_letter.append((message.id, error, traceback))
        else:
            self.errors.append((message.id, error, traceback))
            self._schedule_retry(message.id, message.deliveries)

    def _not_run(self, messages):
        """Deliveries on which no handler ran (the guard's marks refused at maxmemory, or the key busy
        elsewhere): take their count back and retry them after the back-off of the deliveries that ran.

        Without this, each retry during a maxmemory episode counted as a delivery: entries that never
        ran reached max_deliveries and were dead-lettered ("killed or stuck"), by this loop or by the
        reclaim daemon, and their back-off grew as if they kept failing.
        """
        args = [self.group, self.consumer]
        for message in messages:
            ran = max(0, message.deliveries - 1)
            args += [message.id, ran]
            self._schedule_retry(message.id, ran)
        try:
            scripts.run(self.conn, "undeliver", [self.stream], args)
        except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:
            # The retry is scheduled all the same; the count stays one too high for this delivery.
            logger.warning("Consumer %s: could not take back the delivery count of %d entries of %s/%s that did "
                           "not run: %s", self.consumer, len(messages), self.stream, self.group, exc)

    def _schedule_retry(self, entry_id, deliveries):
        due = self.clock() + backoff_seconds(deliveries, self.retry_base, self.retry_cap)
        heapq.heappush(self.retries, (due, entry_id, deliveries))

    def flush_failures(self):
        """Record last errors and make dead-letter moves in one round trip (failures only: off the hot path).

        At maxmemory Redis refuses both: last errors are skipped (a dead letter then says no error was
        recorded), moves stay queued and are tried again after REFUSED_RETRY_SECONDS; the entries stay
        pending meanwhile, so nothing is lost and nothing else waits for them.
        """
        if not self.errors and not self.to_dead_letter:
            return
        if not self.errors and self.clock() < self.moves_due:
            return
        self.to_dead_letter = list({f[0]: f for f in self.to_dead_letter}.values())  # audit passes re-add
        pipe = slot_pipeline(self.conn, self.stream)  # the dead-letter script shares it: one slot, one node
        deadletters.record_errors(self.conn, self.stream, self.group, self.consumer, self.errors, self.error_ttl, pipeline=pipe)
        moves = deadletters.move(self.conn, self.stream, self.group, self.to_dead_letter, pipeline=pipe)
        replies = pipe.execute(raise_on_error=False)
        result = moves.result(replies)  # raises NOGROUP/WRONGTYPE like a plain command would
        problems = [r for r in replies if isinstance(r, Exception)]
        oom = next((r for r in problems if is_oom(r)), None)
        if oom is not None and self.errors:
            refusals.refused("last_error", oom)
        elif problems and not result.refused:
            logger.warning("Consumer %s: could not record %d last errors of %s/%s: %s", self.consumer,
                           len(self.errors), self.stream, self.group, problems[0])
        if result.moved:
            self.dead_lettered += len(result.moved)
            metrics.record_dead_lettered(self.stream, self.group, len(result.moved))
            logger.warning("Consumer %s: moved %d entries of %s/%s to %s", self.consumer, len(result.moved),
                           self.stream, self.group, dead_letter_key(self.stream))
        self.errors = []
        refused = {entry_id for entry_id, _ in result.refused}
        # Kept: what Redis refused, and what the group lost (then _hold_again puts them back to be moved).
        kept = refused | (set(result.not_pending) if result.not_pending and self._recreated_elsewhere() else set())
        self.to_dead_letter = [f for f in self.to_dead_letter if f[0] in kept]
        if refused:
            self.moves_due = self.clock() + REFUSED_RETRY_SECONDS
            refusals.refused("dead_letter", result.refused[0][1])
        elif oom is None:
            refusals.accepted()

    def _adapt_chunk(self, seconds):
        avg = self.seconds_per_message
        self.seconds_per_message = seconds if avg is None else 0.8 * avg + 0.2 * seconds
        ideal = int(CHUNK_TARGET_SECONDS / max(self.seconds_per_message, 1e-7))
        self.chunk_size = max(1, min(self.max_chunk, ideal))

    def flush_acks(self):
        if not self.to_ack:
            return
        # Ids stay queued until XACK succeeds: an ack lost to a connection error is retried.
        self.conn.xack(self.stream, self.group, *self.to_ack)
        self._acked(len(self.to_ack))

    def _acked(self, count):
        self.handled += count
        self.to_ack = []

    # -- stopping and Redis trouble ---------------------------------------------------------

    def drain(self):
        """Let in-flight handlers finish until the shutdown deadline, acking as they do."""
        while self.busy_chunks and self.clock() < self.shutdown.deadline:
            self.collect(timeout=min(0.1, max(0.001, self.shutdown.deadline - self.clock())))
            self._try_flush()
            try:
                self.keep_alive(self.clock())
            except (*TRANSIENT_ERRORS, redis.ResponseError):
                pass  # entries not kept alive are taken over after the pending timeout: at worst run twice
        self.collect()
        while (self.to_ack or self.to_dead_letter) and not self._try_flush() and self.clock() < self.shutdown.deadline:
            time.sleep(0.1)
        if self.busy_chunks or self.to_ack:
            logger.warning("Consumer %s: stopping with %d entries of %s/%s unacknowledged; they stay pending for takeover",
                           self.consumer, len(self.in_flight) + len(self.to_ack), self.stream, self.group)
        else:
            self.leave()

    def leave(self):
        """Remove this consumer from the group if it holds nothing, so a clean stop leaves no name behind.

        Names are unique per process start: without this, every deploy would leave one per worker
        until the reclaim daemon's DEAD_CONSUMER_IDLE. A consumer still holding entries (failed ones
        waiting for their retry) stays until another takes them over and the daemon removes it.
        """
        try:
            left = scripts.run(self.conn, "leave_group", [self.stream], [self.group, self.consumer])
        except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:  # Redis down, or the group gone with it
            logger.info("Consumer %s: could not leave %s/%s (%s); the reclaim daemon removes it later",
                        self.consumer, self.stream, self.group, exc)
            return False
        return bool(left)

    def _try_flush(self):
        try:
            self.flush_acks()
            self.flush_failures()
            if not self.ready and self.lost and self.to_dead_letter:  # found recreated elsewhere while stopping
                self.make_ready(self.clock())  # puts the moves back in the group, to be made now
                self.flush_failures()
            return True
        except TRANSIENT_ERRORS:
            return False

    def _redis_down(self, exc):
        self.failures += 1
        recover(self.conn)  # scripts and CLIENT LIST go to nodes directly: follow a failover
        if self.failures == 1 and self.outage.went_down(self):
            logger.warning("Consumer %s: Redis unreachable (%s); retrying with back-off", self.consumer, exc)
        self.shutdown.wait(backoff_delay(self.failures, first=0.1, cap=self.backoff_max, jitter=0.5))

    def _redis_ok(self):
        if self.failures:
            self.judge_dead_after = self.clock() + self.consumer_ttl
            if self.outage.came_back(self):
                logger.warning("Consumer %s: Redis reachable again after %d failed attempts", self.consumer,
                               self.failures)
            self.failures = 0
