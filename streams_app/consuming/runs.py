"""The run ledger: a pending entry's delivery count is the handler runs charged to it, plus one (issue 32).

Redis counts a delivery on every XREADGROUP and XCLAIM, so a worker killed with a read of twenty
entries left all twenty charged: entries that were only waiting for a thread, and entries whose
handler had returned but whose ack was still queued. After a few such deaths the reclaim daemon and
the takeovers dead-lettered them as "killed or stuck mid-handler" though they never ran (or ran fine).

So the cost is paid at takeover, not per entry:

- Each pending entry's count is its charged runs + 1: the delivery it is on is not charged yet.
  XREADGROUP gives 1; a retry's XCLAIM sets runs + 1 (RETRYCOUNT); a refused delivery leaves it.
- ``started`` (handler thread, before a chunk's handlers run): one HSET records the chunk's ids in
  the consumer's running record (keys.running_key: a hash in the stream's slot, one field per chunk,
  expiring after RECORD_TTL_MS; field "-" says the consumer keeps a ledger). Entries waiting for a
  thread are not in it. On the event loop (``started_async``) the chunks that start in one turn
  share one write.
- ``finished`` (right after the handlers return, before the result goes back to the read loop): the
  chunk's field is deleted, and each entry that failed and will be retried is charged its run
  (count = runs + 1) in the same script (runs_done.lua). An entry whose handler returned is thus
  never charged, should the process die before the read loop's ack.
- Whoever takes over a consumer's entries (the takeovers of takeover.py, the reclaim daemon's check of
  what is over max_deliveries) reads its running record in the same Lua script (take_over_runs.lua):
  an entry recorded as running alone in its process (a suspect's run, alone.py; value '!' + its id)
  was what killed its holder: charged (runs = count). Any other entry was not charged: runs = count - 1.
  A holder with no record keeps no ledger (Redis's counts, a client outside Shoal): runs = count.
  Every recorded entry is a suspect: it runs alone (chunks.run_suspect), after what succeeded beside it
  is acked, so a death then is charged to it exactly.

Why only alone: beside other runs, which one killed the process is not known, and the record is a
moment off the truth at both ends (a chunk is recorded just before its handlers start and leaves just
after they return; async chunks of one turn are recorded together). Charging chunks of one there
dead-lettered, at max_deliveries 1, neighbours that never started or had returned (a user trial). So a
death is charged only to a suspect's run, and a killer runs max_deliveries + 1 times at most: its first
death, beside others, is free. Costs: one HSET (with PEXPIRE) when a chunk starts and one HDEL when it
ends, whatever its size; a script with per-entry work only for failed entries and at takeover.
"""
import asyncio
import logging

import redis

from shoal_common.redis_errors import is_oom
from shoal_common.text import to_text
from streams_app import scripts
from streams_app.connection import TRANSIENT_ERRORS
from streams_app.keys import running_key

logger = logging.getLogger("streams_app.consumer")

ERRORS = (*TRANSIENT_ERRORS, redis.ResponseError)

# A running record outlives its consumer this long: a dead consumer's entries are taken over well
# within it (a live one renews it with every chunk). Past it, a death is charged to nobody.
RECORD_TTL_MS = 7 * 24 * 3600 * 1000


class RunsNotRecorded(Exception):
    """A chunk's running record could not be written before its handlers ran: nothing was run."""


class RunLedger:
    """The ledger of one group loop: its consumer's running record."""

    def __init__(self, conn, stream, group, consumer, retried):
        self.conn = conn
        self.stream = stream
        self.group = group
        self.consumer = consumer
        # retried(outcome): a failed outcome ran and will be retried (one dead-lettered keeps the count it failed at)
        self.retried = retried
        self._batch = []  # (messages, alone, future) of async chunks to record in the next write (started_async)
        self._charged = set()  # first ids of chunks charged at maxmemory instead of recorded (_charge)
        self.key = running_key(stream, group, consumer)

    def begin(self):
        """The loop starts: its record says from now on that this consumer keeps a ledger (a holder with
        none is charged by Redis's counts). Best effort: the first chunk's record says it as well."""
        try:
            scripts.run(self.conn, "runs_mark", [self.key], [RECORD_TTL_MS])
        except ERRORS:
            pass

    def started(self, messages, alone=False):
        """Before ``messages`` run: recorded as running (raises RunsNotRecorded). ``alone``: they run alone
        in the process (a suspect's run, alone.py): only such a run is charged a death.

        Not run unrecorded: a message that kills its worker would otherwise never reach max_deliveries.
        """
        if messages:
            self._mark([(messages, alone)])

    def _mark(self, chunks):
        args = [RECORD_TTL_MS]
        for messages, alone in chunks:
            args += [messages[0].id, ("!" if alone else "") + ",".join(m.id for m in messages)]
        try:
            try:
                scripts.run(self.conn, "runs_mark", [self.key], args)
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
        suspects after a death, and the whole chunk is charged."""
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

    def finished(self, result, messages):
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
            else:
                self.conn.hdel(self.key, messages[0].id)
        except ERRORS as exc:
            logger.warning("Consumer %s: could not record the end of %d entries of %s/%s: %s", self.consumer,
                           len(messages), self.stream, self.group, exc)



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
