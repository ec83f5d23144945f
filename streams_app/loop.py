"""The read loop of one consumer group inside one worker process.

One pass of the loop is ``tick()``: collect finished handlers, ack them in one XACK, then either
take over abandoned entries (XAUTOCLAIM and this consumer's own failed ones) or read new entries
(XREADGROUP ``>``), and hand them to the handler threads. Reads are sized by free handler slots,
so a worker never hoards entries it cannot start soon: hoarded entries would look abandoned to
other consumers after the pending timeout and be handled twice.
"""
import logging
import queue
import random
import time

import redis

from streams_app.connection import TRANSIENT_ERRORS
from streams_app.execution import run_chunk
from streams_app.groups import ensure_group, is_nogroup
from streams_app.message import Message

logger = logging.getLogger("streams_app.consumer")

# When handlers are in flight a read blocks only briefly, so their acks are not held back.
BUSY_BLOCK_MS = 50
# Aim for chunks of about this much handler time: big enough to amortise the hand-off to a
# thread for fast handlers, one message at a time for slow ones.
CHUNK_TARGET_SECONDS = 0.005


def _str(value):
    return value.decode() if isinstance(value, bytes) else value


class GroupLoop:
    def __init__(self, spec, consumer, *, conn, reader, executor, threads, shutdown, config, clock=time.monotonic):
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
        self.slots = 2 * threads
        self.max_chunk = max(1, -(-self.batch // threads))
        self.chunk_size = 1
        self.seconds_per_message = None

        self.chunks = {}  # future -> the messages it is handling
        self.completions = queue.SimpleQueue()
        self.to_ack = []
        self.ready = False
        self.next_claim = 0.0
        self.claim_cursor = None  # XAUTOCLAIM scan in progress
        self.own_cursor = None  # scan of this consumer's own pending entries in progress
        self.reading = False  # inside a blocking XREADGROUP (shutdown unblocks it)
        self.failures = 0
        self.handled = 0

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
            if not is_nogroup(exc):
                raise
            # Redis lost the group (restart without persistence, FLUSHALL): make it again.
            logger.warning("Consumer %s: group %s on %s is gone (%s); recreating it", self.consumer, self.group, self.stream, exc)
            self.ready = False

    def tick(self, now=None):
        now = self.clock() if now is None else now
        if not self.ready:
            if ensure_group(self.conn, self.stream, self.group, self.spec.start):
                logger.info("Consumer %s: created group %s on %s", self.consumer, self.group, self.stream)
            self.ready = True
        self.collect()
        self.flush_acks()
        free = self.slots - self.busy_chunks
        if self.busy_chunks and free < max(1, self.slots // 2):
            self.collect(timeout=min(1.0, self.block_ms / 1000))
            self.flush_acks()
            return
        capacity = min(self.batch, free * self.chunk_size)
        if self.claim_cursor is not None or self.own_cursor is not None or now >= self.next_claim:
            entries = self.take_over(capacity, now)
            if entries:
                self.dispatch(entries)
                return
        if self.busy_chunks:
            block = BUSY_BLOCK_MS
        else:
            block = min(self.block_ms, max(1, int((self.next_claim - now) * 1000)))
        self.dispatch(self.read_new(capacity, block))

    # -- reading ----------------------------------------------------------------------------

    def read_new(self, count, block_ms):
        self.reading = True
        try:
            if self.shutdown.is_set():
                return []
            reply = self.reader.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        finally:
            self.reading = False
        return [(_str(entry_id), fields, 1) for _, entries in reply or () for entry_id, fields in entries]

    def take_over(self, capacity, now):
        """Entries abandoned by other consumers first, then this consumer's own failed ones."""
        if self.own_cursor is None:
            cursor, claimed, deleted = self.conn.xautoclaim(
                self.stream, self.group, self.consumer, self.pending_timeout_ms,
                start_id=self.claim_cursor or "0-0", count=capacity,
            )
            if deleted:
                # Redis 7 has already dropped these from the PEL: their entries were deleted.
                logger.warning("Consumer %s: %d pending entries of %s were deleted from the stream before being handled: %s",
                               self.consumer, len(deleted), self.stream, ", ".join(map(_str, deleted[:10])))
            cursor = _str(cursor)
            self.claim_cursor = None if cursor == "0-0" else cursor
            if self.claim_cursor is None:
                self.own_cursor = "0-0"
            entries = [(_str(i), f) for i, f in claimed if i is not None]
            if entries:
                logger.info("Consumer %s: took over %d abandoned entries of %s/%s", self.consumer, len(entries), self.stream, self.group)
        else:
            reply = self.conn.xreadgroup(self.group, self.consumer, {self.stream: self.own_cursor}, count=capacity)
            found = [(_str(i), f) for _, entries in reply or () for i, f in entries]
            self.own_cursor = found[-1][0] if len(found) >= capacity else None
            gone = [i for i, f in found if not f]
            if gone:
                self.to_ack.extend(gone)  # deleted from the stream: nothing left to handle
            in_flight = self.in_flight
            entries = [(i, f) for i, f in found if f and i not in in_flight]
        if self.claim_cursor is None and self.own_cursor is None:
            self.next_claim = now + self.claim_interval
        return self._with_deliveries(entries)

    def _with_deliveries(self, entries):
        if not entries:
            return []
        ids = [i for i, _ in entries]
        rows = self.conn.xpending_range(
            self.stream, self.group, min=ids[0], max=ids[-1],
            count=len(ids) + sum(map(len, self.chunks.values())), consumername=self.consumer,
        )
        counts = {_str(row["message_id"]): row["times_delivered"] for row in rows}
        return [(i, f, counts.get(i, 1)) for i, f in entries]

    # -- handing to threads and collecting --------------------------------------------------

    def dispatch(self, entries):
        if not entries:
            return
        messages = [Message(i, self.stream, self.group, f, d, self.consumer) for i, f, d in entries]
        size = self.chunk_size
        for start in range(0, len(messages), size):
            chunk = messages[start : start + size]
            future = self.executor.submit(run_chunk, self.spec.handler, chunk)
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
            acked, failed, seconds = future.result()
        except BaseException:  # run_chunk catches handler errors; this is a bug or a cancel
            logger.exception("Consumer %s: a handler chunk of %s/%s failed outside its handler", self.consumer, self.stream, self.group)
            return
        self._adapt_chunk(seconds)
        self.to_ack.extend(acked)
        for outcome in failed:
            self.on_failure(outcome)

    def on_failure(self, outcome):
        """A failed or undecodable entry stays pending: it is retried at the next take-over pass."""

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
        self.handled += len(self.to_ack)
        self.to_ack = []

    # -- stopping and Redis trouble ---------------------------------------------------------

    def drain(self):
        """Let in-flight handlers finish until the shutdown deadline, acking as they do."""
        while self.busy_chunks and self.clock() < self.shutdown.deadline:
            self.collect(timeout=min(0.1, max(0.001, self.shutdown.deadline - self.clock())))
            self._try_flush()
        self.collect()
        while self.to_ack and not self._try_flush() and self.clock() < self.shutdown.deadline:
            time.sleep(0.1)
        if self.busy_chunks or self.to_ack:
            logger.warning("Consumer %s: stopping with %d entries of %s/%s unacknowledged; they stay pending for takeover",
                           self.consumer, len(self.in_flight) + len(self.to_ack), self.stream, self.group)

    def _try_flush(self):
        try:
            self.flush_acks()
            return True
        except TRANSIENT_ERRORS:
            return False

    def _redis_down(self, exc):
        self.failures += 1
        if self.failures == 1:
            logger.warning("Consumer %s: Redis unreachable (%s); retrying with back-off", self.consumer, exc)
        delay = min(self.backoff_max, 0.05 * 2 ** min(self.failures, 10))
        self.shutdown.wait(delay * random.uniform(0.5, 1.0))

    def _redis_ok(self):
        if self.failures:
            logger.warning("Consumer %s: Redis reachable again after %d failed attempts", self.consumer, self.failures)
            self.failures = 0
