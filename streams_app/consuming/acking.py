"""Acks of a GroupLoop, with the run ledger's ended chunks in the same round trip.

Finished entries wait in ``to_ack`` until XACK succeeds, so an ack lost to a connection error is sent
again. They go out on their own (``flush_acks``) or, on one server, in the round trip of the next read
(``_ack_and_read``: XACK, XREADGROUP and the settling marker's EXISTS). Either way the chunks that
ended leave the run ledger's running record (runs.py) in the same round trip, and a record not sent is
handed back to the ledger to go with the next acks.

A base class of loop.GroupLoop, split out by role. It owns ``to_ack``, ``acked_chunks`` and
``handled``; it reads the loop's stream, group, consumer, connection and reader, ``runs`` (the ledger,
or None) and ``settling`` (the lost-group marker's key), and tells the alone gate (alone.py) that the
acks a suspect waits for were sent.
"""
from streams_app.redis.connection import slot_pipeline
from streams_app.consuming.alone import gate


class Acking:
    def flush_acks(self):
        ended = self.runs is not None and self.runs.has_ended()
        if not self.to_ack and not ended:
            return
        # Ids stay queued until XACK succeeds: an ack lost to a connection error is retried.
        if not ended:
            self.conn.xack(self.stream, self.group, *self.to_ack)
            self._acked(len(self.to_ack))
            return
        acks = self.to_ack
        pipe = slot_pipeline(self.conn, self.stream)  # the running record shares the stream's slot
        if acks:
            pipe.xack(self.stream, self.group, *acks)
        fields = self._send_ended(pipe)
        try:
            replies = pipe.execute(raise_on_error=False)
        except BaseException:
            self.runs.not_sent(fields)
            raise
        if acks:
            if isinstance(replies[0], Exception):
                raise replies[0]
            self._acked(len(acks))

    def _send_ended(self, pipe):
        """Chunks that ended leave the running record (runs.py) in the round trip of their acks: best
        effort (a field left behind names entries acked, or pending and then run alone after a death)."""
        return self.runs.send_ended(pipe) if self.runs is not None else ()

    def _acked(self, count):
        self.handled += count
        self.to_ack = []
        gate.sent(self.acked_chunks)
        self.acked_chunks = 0

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
        ended = self._send_ended(pipe)
        pipe.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        pipe.exists(self.settling)
        try:
            replies = pipe.execute(raise_on_error=False)
        except BaseException:
            if ended:
                self.runs.not_sent(ended)
            raise
        if acks and not isinstance(replies[0], Exception):
            self._acked(len(acks))
        error = next((r for r in replies if isinstance(r, Exception)), None)
        if error is not None:
            raise error  # NOGROUP, UNBLOCKED...: step() handles them as for a plain command
        return replies[-2], replies[-1]
