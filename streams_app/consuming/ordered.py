"""Ordered mode (``@consumer(..., ordered=True)``): one owner per partition, one message at a time.

A partition's read loop acts only while this process holds the partition's lease
(streams_app.consuming.leases). Every command that changes the group's state is a script that
checks the lease token first, in the partition's slot: the read (XREADGROUP), the takeover of what
a previous owner left pending, the redelivery of a failed entry, and the ack. A process that lost
its lease (paused past LEASE_TTL_MS, cut off from Redis) therefore cannot read, take, redeliver or
ack anything of that partition any more, whatever it believes. Handlers are not fenced by Redis: a
handler is started only while the local lease deadline has not passed, but one already running when
the process pauses may finish after another consumer took the partition over (docs/cluster.md).

Order: handlers of one partition run one at a time, in entry id order. A failed entry blocks its
partition (Kafka-like): it is retried after its back-off, and the entries after it wait, until it
succeeds or goes to the dead-letter stream at max_deliveries. Retrying it out of order would let a
later message of the same key overtake it, which is what ordered mode exists to prevent. A new owner
first takes every entry pending in the partition (whoever held them) and hands those out, in id
order, before it reads new ones.
"""
import functools
import heapq
import logging
import time

from shoal_common.text import to_text
from streams_app.redis import scripts
from streams_app.redis.connection import TRANSIENT_ERRORS
from django.db import close_old_connections

from streams_app.consuming.chunks import Chunk, run_chunk, run_chunk_async
from streams_app.consuming.chunks import _checked as checked_call  # the same "did it run" check
from streams_app.consuming.gate import FeederGate
from streams_app.consuming.leases import OWNED, RELEASING, TAKEN
from streams_app.consuming.loop import GroupLoop
from streams_app.consuming.outcomes import ChunkResult
from streams_app.consuming.retry import backoff_seconds
from streams_app.deadletters import store as deadletters
from streams_app.redis.entry_ids import id_key
from streams_app.redis.lag import delivered_id

logger = logging.getLogger("streams_app.consumer")

# An idle loop (lease not held) waits this long for a grant between checks of the shutdown.
IDLE_WAIT_SECONDS = 0.25
# A held lease past its local deadline is looked at again this often (a late renewal may restore it).
UNTRUSTED_WAIT_SECONDS = 0.05
# Ids per fenced XACK script call (Lua's unpack is bounded).
ACK_BATCH = 1000


def run_in_order(handler, messages, guard=None, budget=None, *, still_owner):
    """Run a sync handler on ``messages`` one after the other; stop at the first failure.

    What follows a failed message is neither run nor handed back: it stays pending for this
    consumer, and the loop hands it out again after the failed one (``OrderedGroupLoop.replay``).
    Nothing is started once ``still_owner()`` says the lease is gone. Poison entries fail before
    any handler runs (they are dead-lettered, so skipped, whatever their place).
    """
    if guard is not None:
        return _one_chunk_each(handler, messages, guard, budget, still_owner)
    close_old_connections()
    chunk = Chunk(messages, None, budget)
    call = checked_call(handler)
    runnable = chunk.runnable()
    left, dropped = [], []
    for index, message in enumerate(runnable):
        if not still_owner():
            dropped = runnable[index:]
            break
        if chunk.out_of_time(index):
            left = runnable[index:]
            break
        try:
            call(message)
        except BaseException as exc:  # every exception obeys max_deliveries (see chunks.py)
            chunk.failed(message, exc)
            dropped = runnable[index + 1:]
            break
        chunk.ran(message)
    close_old_connections()
    result = chunk.close([*left, *dropped])  # neither was started: out of the in-flight gauge
    result.left = left  # handed out again now; ``dropped`` waits in the PEL for replay
    result.unrun = dropped  # their delivery ran nothing: the loop takes its count back
    return result


def _one_chunk_each(handler, messages, guard, budget, still_owner):
    """With an idempotency guard: one chunk per message, so no guard mark is set for one not run."""
    total = ChunkResult()
    started = time.perf_counter()
    done = 0
    for index, message in enumerate(messages):
        if not still_owner():
            total.unrun = messages[index:]
            break
        if budget is not None and index and time.perf_counter() - started > budget:
            total.left = messages[index:]
            break
        result = run_chunk(handler, [message], guard)
        done += 1
        total.acked += result.acked
        total.failed += result.failed
        if result.failed:
            total.unrun = messages[index + 1:]
            break
    total.seconds_per_message = (time.perf_counter() - started) / max(done, 1)
    return total


def _fields(flat):
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


class OrderedGroupLoop(GroupLoop):
    """The read loop of one partition in ordered mode; ``lease`` is shared with the Coordinator."""

    def __init__(self, spec, consumer, *, lease, **kwargs):
        super().__init__(spec, consumer, **kwargs)
        # Acks are fenced by the lease (ordered_ack.lua): never sent from a handler thread. Ordered
        # mode keeps Redis's delivery counts (runs.py is not used here).
        self.runs = None
        self.lease = lease
        self.lease_key = lease.key
        self.threads = 1
        self.slots = 1  # one chunk in flight: no two handlers of a partition at once
        if spec.is_async:
            self.run_chunk = run_chunk_async
            self.max_chunk = 1
        else:
            self.run_chunk = functools.partial(run_in_order, still_owner=lease.valid)
            self.max_chunk = self.batch
        self.chunk_size = self.max_chunk
        self.replaying = False  # entries pending for this consumer go out (in id order) before new ones
        self.gate = FeederGate(spec, self.conn, self.shutdown, consumer)  # a new epoch's partition waits (repartition)

    # -- one pass -----------------------------------------------------------------------------

    def tick(self, now=None):
        now = self.clock() if now is None else now
        if self.lease.failed is not None:
            raise RuntimeError(f"the lease coordinator of {self.stream}/{self.group} crashed") from self.lease.failed
        if not self.ready:
            self.make_ready(now)  # a lost group: recreated where it stood, then settling (lost_group.py)
        self.collect()
        lease = self.lease
        if lease.state == TAKEN and lease.valid(now) and not self.chunks:
            self.take_partition()
        if lease.state not in (OWNED, RELEASING) or not lease.valid(now):
            self._not_owner()
            return
        self.flush_acks()
        self.flush_failures()
        if not self.ready:  # the group was found recreated by another process: put back first
            return
        self.keep_alive(now)
        if not self.ready:  # or the keep-alive did (GroupLoop.keep_alive)
            return
        if self.chunks:
            self.collect(timeout=min(1.0, self.block_ms / 1000, self.keep_alive_every))
            self.flush_acks()
            self.flush_failures()
            return
        if lease.state == RELEASING:
            if not self.to_ack:
                self.release()
            return
        if self.settling_now(now) or self.gate.closed(now):
            return
        capacity = max(1, min(self.batch, self.chunk_size, self._time_room()))
        if self.replaying:
            self.dispatch(self.replay(capacity, now))
        else:
            self.dispatch(self.read_owned(capacity, now))

    def _not_owner(self):
        """Not ours (or not trusted now): finish what runs, start nothing; the owner redelivers the rest."""
        if self.chunks:
            self.collect(timeout=0.1)
            return
        if self.to_ack:
            self.flush_acks()  # fenced: refused unless the lease is still ours in Redis
        self.errors, self.to_dead_letter, self.replaying, self.retries = [], [], False, []
        if self.lease.holding:
            self.shutdown.wait(UNTRUSTED_WAIT_SECONDS)  # held but past our deadline: a renewal may come
        else:
            self.lease.granted_event.wait(IDLE_WAIT_SECONDS)

    # -- fenced commands ------------------------------------------------------------------------

    def _fenced(self, name, token, *args):
        """Run a fenced script; None when Redis refused it (not our lease) or we hold no token any more."""
        if token is None:  # the Coordinator found the lease lost since the caller looked
            return None
        return scripts.run(self.conn, name, [self.stream, self.lease_key], list(args))

    def _lost(self, token, what):
        if self.lease.token == token and token is not None:
            logger.warning("Consumer %s: Redis refused to %s %s/%s: another consumer holds its lease now (this "
                           "process was paused or cut off past LEASE_TTL_MS); it stops acting on that partition",
                           self.consumer, what, self.stream, self.group)
        self.lease.lost(token)
        self.replaying, self.retries = False, []

    def take_partition(self):
        """As a new owner: take every entry pending in the partition, to hand them out first, in order."""
        token = self.lease.token
        taken = self._fenced("ordered_takeover", token, self.group, self.consumer, token)
        if taken is None:
            self._lost(token, "take over")
            return
        self.lease.taken_over(token)
        # Where the group stands is what earlier owners read: a group lost from now on is recreated there,
        # and a read behind it is taken back, though this consumer has read nothing of it yet itself.
        stood = delivered_id(self.conn, self.stream, self.group)
        if stood is not None and (self.last_read_id is None or id_key(stood) > id_key(self.last_read_id)):
            self.last_read_id = stood
        self.replaying = True
        self.errors, self.to_dead_letter, self.retries = [], [], []
        logger.info("Consumer %s: owns %s/%s (took over %d pending entries)", self.consumer, self.stream,
                    self.group, taken)

    def read_owned(self, count, now):
        """New entries (fenced XREADGROUP); when there are none, block on XREAD until some arrive."""
        token = self.lease.token
        reply = self._fenced("ordered_read", token, self.group, self.consumer, token, count)
        if reply is None:
            self._lost(token, "read")
            return []
        found, body = reply
        if found:
            # Behind this consumer's last read, or while a lost group settles: taken back, none runs.
            return self.trusted([(to_text(entry_id), _fields(flat), 1) for entry_id, flat in body])
        # A plain XREAD changes nothing in the group: what it sees is read next pass, fenced. It ends
        # before the lease's local deadline, so a lease lost meanwhile is noticed.
        block = int(min(self.block_ms, (self.lease.deadline - now) * 1000))
        if block < 1:
            return []
        self.reading = True
        try:
            if not self.shutdown.is_set():
                self.reader.xread({self.stream: body}, count=1, block=block)
        finally:
            self.reading = False
        return []

    def replay(self, count, now):
        """This consumer's pending entries, in id order: a failed head after its back-off, then the rest.

        Each entry handed out is a counted delivery (``message.deliveries`` is one more than Redis
        had); those left unrun behind a failure get that count back (``ChunkResult.unrun``), so only
        the deliveries that ran count towards max_deliveries.
        """
        rows = self.conn.xpending_range(self.stream, self.group, min="-", max="+", count=count,
                                        consumername=self.consumer)
        busy = set(self.to_ack) | {failure[0] for failure in self.to_dead_letter}
        rows = [row for row in rows if to_text(row["message_id"]) not in busy]
        if not rows:
            self.replaying, self.retries = False, []
            return []
        head, deliveries = to_text(rows[0]["message_id"]), rows[0]["times_delivered"]
        if deliveries >= self.max_deliveries:
            self.to_dead_letter.append((head, deadletters.RECORDED_ERROR, ""))
            self._forget_retries({head})  # held as a dead-letter move now
            return []
        # No back-off for a head that never ran (it waited behind an entry that is gone now).
        wait = backoff_seconds(deliveries, self.retry_base, self.retry_cap) - rows[0]["time_since_delivered"] / 1000
        if deliveries and wait > 0:
            self.shutdown.wait(min(wait, 0.5))
            return []
        token = self.lease.token
        ids = [to_text(row["message_id"]) for row in rows]
        reply = self._fenced("ordered_replay", token, self.group, self.consumer, token, *ids)
        if reply is None:
            self._lost(token, "redeliver")
            return []
        self._forget_retries(set(ids))  # running (held as such) or gone
        entries = []
        for row, found in zip(rows, reply):
            if found:
                entries.append((to_text(found[0]), _fields(found[1]), row["times_delivered"] + 1))
            else:
                self.to_ack.append(to_text(row["message_id"]))  # deleted (trimmed): nothing left to handle
        return entries

    def flush_acks(self):
        if not self.to_ack:
            return
        token = self.lease.token
        if token is None:
            logger.info("Consumer %s: %d handled entries of %s/%s not acked: the lease is gone, the new owner "
                        "delivers them again", self.consumer, len(self.to_ack), self.stream, self.group)
            self.to_ack = []
            return
        for start in range(0, len(self.to_ack), ACK_BATCH):
            if self._fenced("ordered_ack", token, self.group, token, *self.to_ack[start:start + ACK_BATCH]) is None:
                self._lost(token, "acknowledge")
                self.to_ack = []
                return
        self.handled += len(self.to_ack)
        self.to_ack = []

    def flush_failures(self):
        # Dead-letter moves and last errors are not fenced in Redis: they go only while the lease
        # is trusted locally; otherwise the new owner redelivers the entry and records them itself.
        if not self.lease.valid():
            self.errors, self.to_dead_letter = [], []
            return
        super().flush_failures()

    # -- failures: block the partition ---------------------------------------------------------

    def on_failure(self, outcome):
        super().on_failure(outcome)
        self.replaying = True

    def _schedule_retry(self, entry_id, deliveries):
        self.replaying = True  # the back-off is read from the PEL (time since delivery) by replay()
        # Not a timer: only what lost_group puts back when the group is lost, or the PEL would take
        # the failed entry and those behind it with it (neither retried nor dead-lettered).
        heapq.heappush(self.retries, (0.0, entry_id, deliveries))

    def _submit(self, messages):
        if not self.lease.valid():
            self._not_run(messages)  # left pending for the partition's owner: this delivery ran nothing
            return
        super()._submit(messages)

    def _adapt_chunk(self, seconds):
        super()._adapt_chunk(seconds)
        self.chunk_size = self.max_chunk

    # -- leaving ---------------------------------------------------------------------------------

    def release(self):
        """Give the lease back once nothing of ours is in flight, so the next owner starts at once."""
        self.lease.release(self.conn)
        self.replaying = False
        logger.info("Consumer %s: released the lease of %s/%s", self.consumer, self.stream, self.group)

    def drain(self):
        super().drain()
        if self.lease.holding:
            try:
                self.flush_acks()
            except TRANSIENT_ERRORS:
                pass
            self.release()
