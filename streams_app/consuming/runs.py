"""The run ledger: a pending entry's delivery count is the handler runs charged to it, plus one (issue 32).

Redis counts a delivery on every XREADGROUP and XCLAIM, so a worker killed with a read of twenty
entries left all twenty charged: entries that were only waiting for a thread, and entries whose
handler had returned but whose ack was still queued. After a few such deaths the reclaim daemon and
the takeovers dead-lettered them as "killed or stuck mid-handler" though they never ran (or ran fine).

So the cost is paid at takeover, not per entry:

- Each pending entry's count is its charged runs + 1: the delivery it is on is not charged yet.
  XREADGROUP gives 1; a retry's XCLAIM sets runs + 1 (RETRYCOUNT); a refused delivery leaves it.
- ``record`` (the read loop, as it hands a read's chunks to the handler threads): one HSET records
  every chunk's ids in the consumer's running record (keys.running_key: a hash in the stream's slot,
  one field per chunk, expiring after RECORD_TTL_MS; field "-" says the consumer keeps a ledger).
  So an entry waiting for a free thread is in it too: should the process die, it is a suspect (runs
  alone, charged nothing), never charged. One write per read, not one per chunk from each thread.
- ``finished`` (right after the handlers return, before the result goes back to the read loop): a
  chunk with an entry that failed and will be retried leaves the record at once, and that entry is
  charged its run (count = runs + 1) in the same script (runs_done.lua). Any other chunk's field
  leaves in the round trip of the chunk's own XACK (the read loop queues it with the acks: ``ended``,
  ``send_ended``): until then its entries are pending and recorded, and a death charges them nothing.
- A suspect's run (alone.py), and every chunk when Redis refuses the read loop's write at maxmemory,
  records itself from its handler thread instead (``started``, ``started_async``: the async chunks that
  start in one turn share one write) and leaves at once in ``finished``.
- Whoever takes over a consumer's entries (the takeovers of takeover.py, the reclaim daemon's check of
  what is over max_deliveries) reads its running record in the same Lua script (take_over_runs.lua):
  an entry recorded as running alone in its process (a suspect's run, alone.py; value '!' + its id)
  was what killed its holder: charged (runs = count). Any other entry was not charged: runs = count - 1.
  A holder with no record keeps no ledger (Redis's counts, a client outside Shoal): runs = count.
  Every recorded entry is a suspect: it runs alone (chunks.run_suspect), after what succeeded beside it
  is acked, so a death then is charged to it exactly.

Why only alone: beside other runs, which one killed the process is not known, and the record is off the
truth at both ends (a read's chunks are recorded before they get a thread, and leave with their acks).
Charging chunks of one there dead-lettered, at max_deliveries 1, neighbours that never started or had
returned (a user trial). So a
death is charged only to a suspect's run, and a killer runs max_deliveries + 1 times at most: its first
death, beside others, is free. Costs: one script (HSET, PEXPIRE) per read and one HDEL riding in the
next ack's round trip, whatever the chunks' sizes; a script with per-entry work only for retried
failures and at takeover. (Written from the handler threads, one HSET and one HDEL per chunk, the
ledger cost a no-op consumer 30% of its throughput: bench/README.md.)
"""
import asyncio
import logging
import threading

import redis

from shoal_common.redis_errors import is_oom
from shoal_common.text import to_text
from streams_app.redis import scripts
from streams_app.redis.connection import TRANSIENT_ERRORS
from streams_app.redis.keys import running_key

logger = logging.getLogger("streams_app.consumer")

ERRORS = (*TRANSIENT_ERRORS, redis.ResponseError)

# A running record outlives its consumer this long: a dead consumer's entries are taken over well
# within it (a live one renews it with every chunk). Past it, a death is charged to nobody.
RECORD_TTL_MS = 7 * 24 * 3600 * 1000


class RunsNotRecorded(Exception):
    """A chunk's running record could not be written before its handlers ran: nothing was run."""


class RunLedger:
    """The ledger of one group loop: its consumer's running record."""

    def __init__(self, conn, stream, group, consumer, retried, refused=lambda outcome: False):
        self.conn = conn
        self.stream = stream
        self.group = group
        self.consumer = consumer
        # retried(outcome): a failed outcome ran and will be retried (one dead-lettered keeps the count it failed at)
        self.retried = retried
        # refused(outcome): no handler ran (the idempotency guard found its key busy elsewhere)
        self.refused = refused
        self._batch = []  # (messages, alone, future) of async chunks to record in the next write (started_async)
        self._charged = set()  # first ids of chunks charged at maxmemory instead of recorded (_charge)
        self._ended = []  # fields of chunks recorded by ``record`` that ended, to delete with the next ack
        self._ended_lock = threading.Lock()  # appended from handler threads, sent from the read loop
        self.key = running_key(stream, group, consumer)
        self.ahead = RecordedAhead(self)
        # This consumer's record exists in Redis (a write of it succeeded): a takeover then reads counts
        # as runs + 1. Until then a takeover charges this holder by Redis's counts (take_over_runs.lua).
        self.has_record = False

    def begin(self):
        """The loop starts: its record says from now on that this consumer keeps a ledger (a holder with
        none is charged by Redis's counts). Best effort: the first chunk's record says it as well."""
        try:
            scripts.run(self.conn, "runs_mark", [self.key], [RECORD_TTL_MS])
        except ERRORS:
            return
        self.has_record = True

    def release(self):
        """This process is being replaced on purpose (a task past its time limit, streams_app/tasks/timelimits.py):
        nothing it runs killed it. Its record keeps only the ledger's mark, so whoever takes its entries
        over charges them nothing and runs them in ordinary chunks, not one by one as suspects."""
        try:
            self.conn.delete(self.key)
            scripts.run(self.conn, "runs_mark", [self.key], [RECORD_TTL_MS])
        except ERRORS:
            pass  # they are taken over as suspects: slower, and still right

    def record(self, chunks):
        """The read loop hands ``chunks`` (lists of messages) to the handler threads: recorded as running
        in one write. Returns the ledger the chunks are to run with: ``self.ahead`` (recorded), or this
        ledger when Redis refused the write at maxmemory (each chunk then records or charges itself as it
        starts, ``started``). Raises RunsNotRecorded when Redis did not answer: none of them may run."""
        args = self._mark_args([(messages, False) for messages in chunks])
        try:
            scripts.run(self.conn, "runs_mark", [self.key], args)
            self.has_record = True
        except redis.ResponseError as exc:
            if is_oom(exc):
                return self
            raise RunsNotRecorded(f"could not record the start of {sum(map(len, chunks))} entries: {exc}") from exc
        except ERRORS as exc:
            raise RunsNotRecorded(f"could not record the start of {sum(map(len, chunks))} entries: {exc}") from exc
        return self.ahead

    def ended(self, field):
        """A chunk ``record`` recorded has ended and the read loop took its acks: its field goes with them."""
        with self._ended_lock:
            self._ended.append(field)

    def _forget(self, fields):
        """Fields written again now must not be deleted by an HDEL queued before (an entry can head two
        chunks in turn: a retry)."""
        if self._ended:
            again = set(fields)
            with self._ended_lock:
                self._ended = [f for f in self._ended if f not in again]

    def has_ended(self):
        return bool(self._ended)

    def send_ended(self, pipe):
        """Add the HDEL of the ended chunks' fields to ``pipe`` (a pipeline on the stream's node, with the
        acks). Returns the fields; hand them back to ``not_sent`` if the pipeline failed."""
        with self._ended_lock:
            fields, self._ended = self._ended, []
        if fields:
            pipe.hdel(self.key, *fields)
        return fields

    def not_sent(self, fields):
        with self._ended_lock:
            self._ended[:0] = fields

    def started(self, messages, alone=False):
        """Before ``messages`` run: recorded as running (raises RunsNotRecorded). ``alone``: they run alone
        in the process (a suspect's run, alone.py): only such a run is charged a death.

        Not run unrecorded: a message that kills its worker would otherwise never reach max_deliveries.
        """
        if messages:
            self._mark([(messages, alone)])

    def _mark_args(self, chunks):
        """runs_mark.lua's ARGV for ``chunks`` ((messages, alone) pairs); their fields are no longer to delete."""
        args = [RECORD_TTL_MS]
        for messages, alone in chunks:
            args += [messages[0].id, ("!" if alone else "") + ",".join(m.id for m in messages)]
        self._forget(args[1::2])
        return args

    def _mark(self, chunks):
        args = self._mark_args(chunks)
        try:
            try:
                scripts.run(self.conn, "runs_mark", [self.key], args)
                self.has_record = True
            except redis.ResponseError as exc:
                if not is_oom(exc):
                    raise
                self._charge(chunks)
        except ERRORS as exc:
            raise RunsNotRecorded(f"could not record the start of {sum(len(messages) for messages, _ in chunks)} entries: {exc}") from exc

    def _charge(self, chunks):
        """At maxmemory (the record's HSET refused, XCLAIM allowed): each entry of the chunks is charged its
        run before it starts (count = runs + 2, so a takeover finds runs + 1), and set back as it ends
        (``finished``), as the ledger did per entry before it was paid at takeover. Such chunks are not
        suspects after a death, and the whole chunk is charged (the read loop runs such chunks one entry each).

        Not when this consumer has no record in Redis (it started at maxmemory): a takeover charges such a
        holder by Redis's counts already, and a raised count would charge each death twice (a user trial)."""
        if not self.has_record:
            return
        self._set_counts((m.id, m.deliveries + 1) for messages, _ in chunks for m in messages)
        self._charged.update(messages[0].id for messages, _ in chunks)

    def _set_counts(self, pairs):
        by_count = {}
        for entry_id, count in pairs:
            by_count.setdefault(count, []).append(entry_id)
        if not by_count:
            return
        args = [self.group, self.consumer]
        for count, ids in by_count.items():
            args += [count, len(ids), *ids]
        scripts.run(self.conn, "set_runs", [self.stream], args)

    async def started_async(self, messages, alone=False):
        """``started`` on the event loop: the chunks that start in one turn of the loop are recorded
        together, in one write from one thread (a hop to a thread per message would cap async groups)."""
        future = asyncio.get_running_loop().create_future()
        self._batch.append((messages, alone, future))
        if len(self._batch) == 1:
            asyncio.get_running_loop().create_task(self._mark_batch())
        await future

    async def _mark_batch(self):
        await asyncio.sleep(0)  # the other chunks starting in this turn join the batch
        batch, self._batch = self._batch, []
        try:
            await asyncio.to_thread(self._mark, [(messages, alone) for messages, alone, _ in batch])
        except BaseException as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for _, _, future in batch:
            if not future.done():
                future.set_result(None)

    def writes_at_end(self, result):
        return True

    def finished(self, result, messages, suspect=False):
        """Right after the chunk (a ChunkResult of ``messages``): off the running record; each failed
        entry that is retried is charged its run. Best effort: should Redis not answer, the chunk's
        entries are charged a run each if the process dies before the next chunk of this loop is recorded."""
        if not messages:
            return
        retried = [(o.message.id, o.message.deliveries + 1) for o in result.failed if self.retried(o)]
        try:
            if messages[0].id in self._charged:  # charged at maxmemory (_charge): set back what did not fail
                self._charged.discard(messages[0].id)
                ran = {entry_id for entry_id, _ in retried}
                self._set_counts((m.id, m.deliveries) for m in messages if m.id not in ran)
            elif retried:
                scripts.run(self.conn, "runs_done", [self.stream, self.key],
                            [self.group, self.consumer, messages[0].id, *(x for pair in retried for x in pair)])
            elif suspect and any(self.refused(o) for o in result.failed):
                # A suspect the guard refused ran nothing: it stays a suspect (not running alone now), so a
                # taker after a death here runs it alone too. Deleted, it ran later in an ordinary chunk,
                # where its death was charged to nobody (a user trial: killers ran 3-4 times at max_deliveries 1).
                self.conn.hset(self.key, messages[0].id, messages[0].id)
            else:
                self.conn.hdel(self.key, messages[0].id)
        except ERRORS as exc:
            logger.warning("Consumer %s: could not record the end of %d entries of %s/%s: %s", self.consumer,
                           len(messages), self.stream, self.group, exc)



class RecordedAhead:
    """The ledger as the chunks that ``RunLedger.record`` recorded see it: nothing to write as they start;
    as they end, a chunk with a retried failure writes at once (runs_done.lua charges the failure), any
    other leaves the record with the read loop's next ack."""

    def __init__(self, ledger):
        self.ledger = ledger

    def started(self, messages, alone=False):
        pass

    async def started_async(self, messages, alone=False):
        pass

    def writes_at_end(self, result):
        """Whether ``finished`` would call Redis (an async chunk then finishes in a thread, off the loop)."""
        return bool(result.failed)

    def finished(self, result, messages, suspect=False):
        if messages and not any(self.ledger.retried(o) for o in result.failed):
            result.ended = messages[0].id  # the read loop deletes it with the acks (GroupLoop._finish)
        else:
            self.ledger.finished(result, messages, suspect)


def take_over(conn, stream, group, taker, min_idle, max_deliveries, held, check=False):
    """Claim for ``taker`` the entries of ``held`` ({holder: ids}) idle ``min_idle`` ms, charging a run only
    to those their holder was running (take_over_runs.lua). Returns (claimed, over): claimed is a list
    of (id, fields, count, suspect); over the ids whose runs reached ``max_deliveries``, not claimed.
    ``check``: claim nothing, only tell which are over."""
    holders = [h for h, ids in held.items() if ids]
    if not holders:
        return [], []
    args = [group, taker, int(min_idle), max_deliveries, "check" if check else "claim", RECORD_TTL_MS]
    for holder in holders:
        args += [holder, len(held[holder]), *held[holder]]
    # The taker's record: the suspects it claims are written into it (take_over_runs.lua).
    keys = [stream, running_key(stream, group, taker), *(running_key(stream, group, h) for h in holders)]
    claimed, over = scripts.run(conn, "take_over_runs", keys, args)
    entries = [(to_text(i), _fields(f), int(count), bool(suspect)) for i, f, count, suspect in claimed]
    return entries, [to_text(i) for i in over]


def _fields(flat):
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
