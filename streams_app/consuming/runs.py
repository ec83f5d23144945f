"""The delivery count of a pending entry is the number of handler runs it started (issue 32, item 2).

Redis counts a delivery on every XREADGROUP and XCLAIM, so a worker killed with a read of twenty
entries left all twenty charged: entries that were only waiting for a thread, and entries whose
handler had returned but whose ack was still queued. After a few such deaths the reclaim daemon and
the takeovers dead-lettered them as "killed or stuck mid-handler" though they never ran (or ran fine).

So the count follows the runs:

- ``waiting`` (read loop, right after a read or a claim): the count is taken back to the runs so far
  (``deliveries - 1``), so entries queued for a thread are not charged.
- ``started`` (handler thread, before the chunk's handlers run): the count becomes ``deliveries``.
- ``finished`` (handler thread, right after they return): the chunk's acks go out at once, not
  queued for the read loop's next pass, and unstarted entries it hands back are taken back again.

What a death charges is then the chunk that was running: one entry for handlers slower than about
``loop.CHUNK_TARGET_SECONDS`` (one message per chunk), a few milliseconds' worth for faster ones.
All three use undeliver.lua, which sets the count only of entries still owned by this consumer.
Costs two round trips per chunk in its thread and one per read in the loop.
"""
import logging

import redis

from streams_app import scripts
from streams_app.connection import TRANSIENT_ERRORS, slot_pipeline

logger = logging.getLogger("streams_app.consumer")

ERRORS = (*TRANSIENT_ERRORS, redis.ResponseError)


class RunsNotRecorded(Exception):
    """The count of a chunk's entries could not be set before its handlers ran: nothing was run."""


class RunLedger:
    def __init__(self, conn, stream, group, consumer):
        self.conn = conn
        self.stream = stream
        self.group = group
        self.consumer = consumer

    def _set_counts(self, pairs, pipeline=None):
        args = [self.group, self.consumer]
        for entry_id, count in pairs:
            args += [entry_id, count]
        return scripts.run(self.conn, "undeliver", [self.stream], args, pipeline=pipeline)

    def waiting(self, entries):
        """Read loop: (id, fields, deliveries) just read or claimed are not charged until they start.

        Best effort: should Redis not answer, they run with the count Redis gave them (one too high
        for entries that never start before a death), as before this ledger.
        """
        if not entries:
            return
        try:
            self._set_counts((entry_id, deliveries - 1) for entry_id, _, deliveries in entries)
        except ERRORS as exc:
            logger.warning("Consumer %s: could not take back the delivery count of %d entries of %s/%s read "
                           "and not yet started: %s", self.consumer, len(entries), self.stream, self.group, exc)

    def started(self, messages):
        """Handler thread, before ``messages`` run: each is charged its delivery (raises RunsNotRecorded).

        Not run uncounted: a message that kills its worker would otherwise never reach max_deliveries.
        """
        if not messages:
            return
        try:
            self._set_counts((m.id, m.deliveries) for m in messages)
        except ERRORS as exc:
            raise RunsNotRecorded(f"could not record the start of {len(messages)} entries: {exc}") from exc

    def finished(self, result):
        """Handler thread, right after the chunk (a ChunkResult): ack what succeeded now; take back
        the count of what it never started (``left``). Returns True when the acks went out (the read
        loop then only counts them); False leaves them to the loop's next ack, as before.
        """
        pairs = [(m.id, m.deliveries - 1) for m in result.left]
        if not result.acked and not pairs:
            return True
        pipe = slot_pipeline(self.conn, self.stream)
        if result.acked:
            pipe.xack(self.stream, self.group, *result.acked)
        if pairs:
            self._set_counts(pairs, pipeline=pipe)
        try:
            replies = pipe.execute(raise_on_error=False)
        except ERRORS:
            return False
        return bool(result.acked) and not isinstance(replies[0], Exception)
