"""The delivery count of a pending entry is the number of handler runs it started (issue 32, item 2).

Redis counts a delivery on every XREADGROUP and XCLAIM, so a worker killed with a read of twenty
entries left all twenty charged: entries that were only waiting for a thread, and entries whose
handler had returned but whose ack was still queued. After a few such deaths the reclaim daemon and
the takeovers dead-lettered them as "killed or stuck mid-handler" though they never ran (or ran fine).

So the count follows the runs:

- ``waiting`` (read loop, as it hands chunks to the threads): chunks that a free thread starts at
  once keep the delivery Redis counted; for those queued behind busy threads it is taken back to the
  runs so far (``deliveries - 1``), so entries that wait for a thread are not charged.
- ``started`` (handler thread, before a queued chunk's handlers run): the count becomes ``deliveries``.
- ``finished`` (handler thread, right after they return): the count of each entry whose handler
  returned is taken back at once, so a death before the read loop's next ack does not charge it
  (it runs again: at-least-once). Acks stay the loop's, batched: sent from the threads they raced
  the lost-group protocol.

What a death charges is then the chunk that was running: one entry for handlers slower than about
``loop.CHUNK_TARGET_SECONDS`` (one message per chunk), a few milliseconds' worth for faster ones.
Counts are set with set_runs.lua, which touches only entries still owned by this consumer. Costs:
one script run per chunk in its thread, and for queued chunks one at hand-in (per read) and one more
in the thread.
"""
import logging

import redis

from streams_app import scripts
from streams_app.connection import TRANSIENT_ERRORS

logger = logging.getLogger("streams_app.consumer")

ERRORS = (*TRANSIENT_ERRORS, redis.ResponseError)


class RunsNotRecorded(Exception):
    """The count of a chunk's entries could not be set before its handlers ran: nothing was run."""


class RunLedger:
    """The ledger of one group loop; ``queued`` is its view for chunks that wait for a thread."""

    def __init__(self, conn, stream, group, consumer):
        self.conn = conn
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.queued = _Queued(self)

    def _set_counts(self, pairs):
        by_count = {}
        for entry_id, count in pairs:
            by_count.setdefault(count, []).append(entry_id)
        args = [self.group, self.consumer]
        for count, ids in by_count.items():
            args += [count, len(ids), *ids]
        return scripts.run(self.conn, "set_runs", [self.stream], args)

    def waiting(self, messages):
        """Read loop: ``messages`` (read, claimed or handed back) wait for a thread: not charged until they start.

        Best effort: should Redis not answer, they run with the count Redis gave them (one too high
        for entries that never start before a death), as before this ledger.
        """
        if not messages:
            return
        try:
            self._set_counts((m.id, m.deliveries - 1) for m in messages)
        except ERRORS as exc:
            logger.warning("Consumer %s: could not take back the delivery count of %d entries of %s/%s read "
                           "and not yet started: %s", self.consumer, len(messages), self.stream, self.group, exc)

    def started(self, messages):
        """Handler thread, a chunk that started at once: Redis counted its delivery already."""

    def finished(self, result, messages):
        """Handler thread, right after the chunk (a ChunkResult of ``messages``): the delivery of each
        entry whose handler returned is taken back at once (``deliveries - 1``: it did not die running),
        so a death of the process before the read loop's next ack does not charge it. The loop acks
        them as before: acks from the threads would race the lost-group protocol (lost_group.py)."""
        acked = set(result.acked)
        pairs = [(m.id, m.deliveries - 1) for m in messages if m.id in acked]
        if not pairs:
            return
        try:
            self._set_counts(pairs)
        except ERRORS:
            pass  # charged one run too many should the process die before the ack; retried, not lost


class _Queued:
    """A chunk queued behind busy threads: its count was taken back (``waiting``); set it when it starts."""

    def __init__(self, ledger):
        self.ledger = ledger

    def started(self, messages):
        """Before ``messages`` run: each is charged its delivery (raises RunsNotRecorded).

        Not run uncounted: a message that kills its worker would otherwise never reach max_deliveries.
        """
        if not messages:
            return
        try:
            self.ledger._set_counts((m.id, m.deliveries) for m in messages)
        except ERRORS as exc:
            raise RunsNotRecorded(f"could not record the start of {len(messages)} entries: {exc}") from exc

    def finished(self, result, messages):
        return self.ledger.finished(result, messages)
