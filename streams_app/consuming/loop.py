"""The read loop of one consumer group inside one worker process.

One pass of the loop is ``tick()``: collect finished handlers, ack them in one XACK, record
failures (last errors, dead-letter moves) in one pipeline, then either take over entries (this
consumer's own failed ones whose back-off has passed, and entries abandoned by other consumers:
takeover.py) or read new entries (XREADGROUP ``>``), and hand them to the handler threads. Reads
are sized by free handler slots, so a worker never hoards entries it cannot start soon: hoarded
entries would look abandoned to other consumers after the pending timeout and be handled twice.

Retries: a failed entry stays pending and goes on a heap keyed by when its back-off ends; it is
redelivered with XCLAIM by this consumer then. Entries of other consumers are found with
XPENDING ... IDLE (idle time and delivery count) and claimed only when idle past both the pending
timeout and their back-off, so a message that kills its worker is not retried in a hot loop.
At max_deliveries, or at once for undecodable input, an entry is moved to ``{S}:dlq``.

A group destroyed or flushed under the loop is recreated where it stood by the lost-group protocol
(lost_group.py), which the loop calls at a few named points: when a command says the group is gone
(``step``), when it makes the group ready (``make_ready``), on every read (``trusted``), and when
entries it holds are found not pending (keep-alive, retries, dead-letter moves).

GroupLoop is this pass and its reads, hand-offs and collection; the rest of what it does is in base
classes split out by role, each sharing the loop's state: takeover.py (taking entries over),
failures.py (the retry schedule, last errors, dead-letter moves, deliveries that ran nothing: what
the run ledger asks about), acking.py (acks, with the run ledger's ended chunks) and stopping.py
(draining, leaving the group, Redis trouble).
"""
import logging
import queue
import time

import redis

from shoal_common.redis_errors import is_lost_group, is_oom, is_unblocked
from shoal_common.text import to_text
from streams_app import tracing
from streams_app.redis import scripts
from streams_app.redis.connection import TRANSIENT_ERRORS, is_cluster
from streams_app.consuming import bands, refusals
from streams_app.consuming.acking import Acking
from streams_app.consuming.chunks import run_chunk, run_chunk_async, run_suspect, run_suspect_async
from streams_app.consuming.failures import REFUSED_RETRY_SECONDS, Failures
from streams_app.consuming.groups import ensure_group
from streams_app.consuming.outage import OutageLog
from streams_app.consuming.idempotency import make_guard
from streams_app.consuming.lost_group import LostGroupProtocol
from streams_app.consuming.outcomes import Outcome, Status
from streams_app.consuming.retry import KEEP_ALIVE_FRACTION, backoff_policy
from streams_app.consuming.runs import RunLedger, RunsNotRecorded
from streams_app.consuming.stopping import Stopping
from streams_app.consuming.takeover import TakeOver
from streams_app.redis.keys import dead_letter_key
from streams_app.publishing.message import Message

logger = logging.getLogger("streams_app.consumer")

# When handlers are in flight a read blocks only briefly, so their acks are not held back.
BUSY_BLOCK_MS = 50
# Aim for chunks of about this much handler time: big enough to amortise the hand-off to a
# thread for fast handlers, one message at a time for slow ones.
CHUNK_TARGET_SECONDS = 0.005
# Entries per keep-alive script run: keeps one run short, so it does not stall other clients.
KEEP_ALIVE_BATCH = 500


_str = to_text


class GroupLoop(Failures, Acking, Stopping, TakeOver):
    # runconsumer --burst: stop once a read finds nothing new and nothing is running or left to settle,
    # in every loop of the process at once (burst.BurstGate, shared by them).
    burst = False
    burst_gate = None
    read_nothing = False  # the last XREADGROUP ">" came back empty
    read_epoch = 0  # the gate's epoch when that read started

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
        # None without opentelemetry; else it wraps the handler in spans while a tracer provider is set.
        self.tracing = tracing.for_consumer(self.max_deliveries, self._retry_delay, dead_letter_key(self.stream))
        # Delivery counts follow handler runs (runs.py), unless STREAMS["COUNT_HANDLER_RUNS"] trades that for speed.
        self.runs = (RunLedger(conn, self.stream, self.group, consumer, self._retried, self._refused)
                     if config["COUNT_HANDLER_RUNS"] else None)
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
        self.last_read_id = None  # where to recreate a group lost while consuming (lost_group.py)
        self.lost_group = LostGroupProtocol(self)
        self.settling = self.lost_group.settling  # the marker every read asks about (_ack_and_read)
        self.moves_due = 0.0  # dead-letter moves Redis refused wait until then
        self.can_list_clients = True  # False for a Redis user without CLIENT LIST (see _claim_from_dead)
        self.chunk_size = 1
        # A handler that writes per chunk (the task runner's QueueHandler: a chunk's starts and successes are
        # a round trip each) asks for longer chunks, to spread those round trips over more messages.
        self.chunk_seconds = getattr(spec.handler, "shoal_chunk_seconds", CHUNK_TARGET_SECONDS)
        self.seconds_per_message = None
        # Acks, read and settling check in one pipeline (_ack_and_read). Not on a cluster: a plain
        # pipeline on the stream's node would not follow a moved slot as the cluster client does.
        self.one_round_trip = not is_cluster(reader)

        self.chunks = {}  # future -> the messages it is handling
        self.suspects = set()  # ids taken over from a dead or stuck consumer that had run them (takeover.py)
        self.suspect_runs = set()  # suspects handed to a thread to run alone, until collected
        self.peers = (self,)  # the read loops sharing this one's handler pool (Worker.boot sets them all)
        self.completions = queue.SimpleQueue()
        self.to_ack = []
        self.acked_chunks = 0  # chunks whose acks are in to_ack (a suspect waits for them: alone.py)
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
        while not self.shutdown.is_set() and not self.burst_done():
            self.step()
        self.drain()

    def burst_done(self):
        """Burst mode is over: the stream had nothing new at the last read, and no handler runs and no ack,
        last error or dead-letter move waits, here and in every other loop of the process, since after
        the last handler anywhere finished (burst.py). Entries waiting for a retry stay pending for their back-off."""
        if not self.burst:
            return False
        idle = self.read_nothing and not self.chunks and not (self.to_ack or self.errors or self.to_dead_letter)
        if self.burst_gate is None:
            return idle
        if not idle:
            self.burst_gate.busy(self)
            return self.burst_gate.over
        return self.burst_gate.idle(self, self.read_epoch)

    def step(self):
        """One pass that survives Redis trouble: back off on connection errors, remake a lost group."""
        try:
            if self.failures:
                # Back from an outage (if this pass gets through): judge nobody dead for one
                # CONSUMER_TTL from now, this pass's takeovers included (takeover._claim_from_dead).
                self.judge_dead_after = self.clock() + self.consumer_ttl
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
            self.lost_group.noticed(exc)

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
        watching = self.spec.yields_to and not bands.higher_bands_idle(self)  # then the higher bands may fill up
        if watching and bands.waiting(self.conn, self.spec.yields_to, self.group):
            self.flush_acks()  # a higher priority band has unread entries: leave the threads to them
            self.collect(timeout=bands.YIELD_SECONDS)
            return
        if self.busy_chunks:
            block = BUSY_BLOCK_MS
        else:
            block = min(self.block_ms, max(1, int((min(self.next_claim, next_retry) - now) * 1000)))
            if watching:  # a read blocked here would not see a higher band filling up
                block = min(block, int(bands.YIELD_SECONDS * 1000))
        if self.burst_gate is not None:
            self.read_epoch = self.burst_gate.epoch
        entries = self.read_new(capacity, block)
        self.read_nothing = not entries
        self.dispatch(entries)

    def make_ready(self, now):
        """Create the group at ``start``, or, once it was lost while consuming, where it stood (lost_group.py)."""
        if self.runs is not None:
            self.runs.begin()
        if self.lost_group.lost:
            self.lost_group.recreate(now)
        elif ensure_group(self.conn, self.stream, self.group, self.spec.start):
            logger.info("Consumer %s: created group %s on %s at %s", self.consumer, self.group, self.stream,
                        self.spec.start)
        self.ready = True

    def settling_now(self, now):
        """A lost group settling (see lost_group.py): finish and ack, read nothing; True while it does."""
        read_after = self.lost_group.read_after
        if now >= read_after:
            return False
        self.flush_acks()
        self.collect(timeout=min(0.2, read_after - now))
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
        comes while the group settles (taken back, see lost_group.takes_back); else all of it, noted as
        read. ``settling``: whether the marker existed right after the read, when that read asked (else None)."""
        if self.lost_group.takes_back(entries, settling):
            return []
        if entries:
            self.last_read_id = entries[-1][0]
        return entries

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
            self.lost_group.recreated_elsewhere()

    # -- handing to threads and collecting --------------------------------------------------

    def dispatch(self, entries):
        if not entries:
            return
        self._submit([Message(i, self.stream, self.group, f, d, self.consumer) for i, f, d in entries])

    def _submit(self, messages):
        size = self.chunk_size
        if self.chunk_seconds > CHUNK_TARGET_SECONDS:
            # Longer chunks must not leave threads idle: a short read still goes to every thread.
            size = min(size, max(1, -(-len(messages) // self.threads)))
        suspects = []
        if self.suspects:
            # Taken over from a worker that was running them when it died: one at a time, alone (alone.py).
            suspects = [m for m in messages if m.id in self.suspects]
            if suspects:
                self.suspects.difference_update(m.id for m in suspects)
                messages = [m for m in messages if m.id not in {s.id for s in suspects}]
        chunks = [messages[start : start + size] for start in range(0, len(messages), size)]
        # Without the run ledger (ordered mode's run_in_order takes no ``runs``), four arguments.
        extra = () if self.runs is None else (self.runs,)
        ahead = extra
        if chunks and self.runs is not None:
            try:
                ahead = (self.runs.record(chunks),)  # one write for the read, before any of it runs
            except RunsNotRecorded as exc:
                logger.warning("Consumer %s: %s of %s/%s; retried", self.consumer, exc, self.stream, self.group)
                self._not_run(messages)
                chunks = []
            if ahead[0] is self.runs:
                # Refused at maxmemory: each chunk charges its entries while it runs (runs._charge), so a
                # death then charges a whole chunk, returned entries included: chunks of one entry.
                chunks = [[message] for chunk in chunks for message in chunk]
        handler = self.spec.handler if self.tracing is None else self.tracing.handler(self.spec.handler, self.spec.is_async)
        argsets = [(handler, chunk, self.guard, self.chunk_budget, *ahead) for chunk in chunks]
        submit_many = getattr(self.executor, "submit_many", None)  # the event loop: one wake-up for all
        if submit_many is not None:
            futures = submit_many(self.run_chunk, argsets)
        else:
            futures = [self.executor.submit(self.run_chunk, *args) for args in argsets]
        alone = run_suspect_async if self.spec.is_async else run_suspect
        for message in suspects:
            self.suspect_runs.add(message.id)
            chunks.append([message])
            futures.append(self.executor.submit(alone, self.run_chunk, handler, [message], self.guard,
                                                self.chunk_budget, *extra))
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
            self._take_result(chunk, future)
        finally:
            if self.suspect_runs:
                self.suspect_runs.discard(chunk[0].id)

    def _take_result(self, chunk, future):
        if self.burst_gate is not None:
            self.burst_gate.progressed()
        try:
            result = future.result()
        except BaseException as exc:  # run_chunk catches handler errors; this is a bug, a guard's Redis error or a cancel
            if (is_oom(exc) or isinstance(exc, RunsNotRecorded)) and chunk[0].id in self.suspect_runs:
                self.suspects.add(chunk[0].id)  # it ran nothing: a suspect still, in the record and here
            elif self.runs is not None:
                self.runs.ended(chunk[0].id)  # none of it runs any more (a field already gone is no matter)
            if is_oom(exc):  # the redis guard cannot set its marks at maxmemory: run these later
                refusals.refused("idempotency", exc)
                self._not_run(chunk)
                return
            if isinstance(exc, RunsNotRecorded):  # Redis did not answer before any handler of it ran
                logger.warning("Consumer %s: %s of %s/%s; retried", self.consumer, exc, self.stream, self.group)
                self._not_run(chunk)
                return
            logger.exception("Consumer %s: a handler chunk of %s/%s failed outside its handler", self.consumer, self.stream, self.group)
            # A failed delivery like any other, so even an error outside the handler that repeats
            # on every delivery ends in the dead-letter stream at max_deliveries, not in a loop.
            for message in chunk:
                self.on_failure(Outcome(message, Status.FAILED, exc))
            return
        self._adapt_chunk(result.seconds_per_message)
        if result.acked and self.runs is not None:
            self.acked_chunks += 1
        self.to_ack.extend(result.acked)
        if result.ended is not None:
            self.runs.ended(result.ended)  # off the running record in the round trip of these acks
        for outcome in result.failed:
            self.on_failure(outcome)
        if result.unrun:
            self._not_run(result.unrun)  # waited behind a failure: that delivery must not count
        if result.left:
            self._submit(result.left)  # still ours in the PEL; the smaller chunk size now applies

    def _adapt_chunk(self, seconds):
        avg = self.seconds_per_message
        self.seconds_per_message = seconds if avg is None else 0.8 * avg + 0.2 * seconds
        ideal = int(self.chunk_seconds / max(self.seconds_per_message, 1e-7))
        self.chunk_size = max(1, min(self.max_chunk, ideal))
