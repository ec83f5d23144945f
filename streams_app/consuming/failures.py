"""Failed deliveries of a GroupLoop: the retry schedule, last errors, dead-letter moves, and
deliveries that ran nothing.

A failed entry stays pending: ``on_failure`` either queues it for the dead-letter stream (poison, or
out of deliveries) or records its error and puts it on the retry heap, keyed by when its back-off
ends (takeover.py redelivers it then). A delivery on which no handler ran (the redis guard's key busy
elsewhere or its marks refused at maxmemory, the run ledger not written, or waiting behind a failure in
its chunk) is retried without counting: ``_not_run``. ``flush_failures`` writes last errors and makes
dead-letter moves in one round trip. ``_retried`` and ``_refused`` are what the run ledger (runs.py)
asks of a failed outcome when it decides what a run is charged.

A base class of loop.GroupLoop, split out by role. It owns the loop's ``errors``, ``to_dead_letter``,
``moves_due`` and ``dead_lettered``, and fills its ``retries`` heap (takeover.py takes from it); it
reads the loop's stream, group, consumer, connection, clock, ``max_deliveries``, retry policy,
``error_ttl``, ``runs`` and ``suspect_runs`` (a suspect that ran nothing goes back to ``suspects``),
and asks the lost-group protocol (``lost_group``) whether the group was recreated elsewhere when moves
find their entries not pending.
"""
import heapq
import logging

import redis

from shoal_common.redis_errors import is_oom
from streams_app.redis import scripts
from streams_app.redis.connection import TRANSIENT_ERRORS, slot_pipeline
from streams_app.consuming import refusals
from streams_app.consuming.idempotency import DuplicateInFlight
from streams_app.consuming.outcomes import Status, dead_lettered
from streams_app.consuming.retry import backoff_seconds
from streams_app.deadletters import store as deadletters
from streams_app.redis.keys import dead_letter_key
from streams_app.metrics import consumer as metrics

logger = logging.getLogger("streams_app.consumer")

# How long dead-letter moves Redis refused (maxmemory) wait before they are tried again.
REFUSED_RETRY_SECONDS = 1.0


class Failures:
    def on_failure(self, outcome):
        """Poison or out of deliveries: dead-letter. Otherwise record the error and retry after a back-off."""
        message = outcome.message
        if isinstance(outcome.error, DuplicateInFlight):
            if message.id in self.suspect_runs:
                self.suspects.add(message.id)  # it ran nothing: its retry runs alone, as a suspect still
            self._not_run([message])  # another consumer runs the same key: this delivery ran nothing
            return
        poison = outcome.status is Status.POISON
        error, traceback = deadletters.describe(outcome.error, poison=poison)
        if dead_lettered(outcome, self.max_deliveries):
            self.to_dead_letter.append((message.id, error, traceback))
        else:
            self.errors.append((message.id, error, traceback))
            self._schedule_retry(message.id, message.deliveries)

    @staticmethod
    def _refused(outcome):
        """Whether ``outcome`` ran no handler: its key was busy elsewhere (the redis guard)."""
        return isinstance(outcome.error, DuplicateInFlight)

    def _retried(self, outcome):
        """Whether a failed ``outcome`` ran its handler and will be retried (on_failure's decision)."""
        return not isinstance(outcome.error, DuplicateInFlight) and not dead_lettered(outcome, self.max_deliveries)

    def _not_run(self, messages):
        """Deliveries on which no handler ran (the guard's marks refused at maxmemory, or the key busy
        elsewhere): take their count back and retry them after the back-off of the deliveries that ran.
        With the run ledger (runs.py) the count is already the runs + 1: nothing to take back.

        Without this, each retry during a maxmemory episode counted as a delivery: entries that never
        ran reached max_deliveries and were dead-lettered ("killed or stuck"), by this loop or by the
        reclaim daemon, and their back-off grew as if they kept failing.
        """
        args = [self.group, self.consumer]
        for message in messages:
            ran = max(0, message.deliveries - 1)
            args += [message.id, ran]
            self._schedule_retry(message.id, ran)
        if self.runs is not None:
            return  # the run ledger charged nothing: its count is still the runs + 1 (runs.py)
        try:
            scripts.run(self.conn, "undeliver", [self.stream], args)
        except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:
            # The retry is scheduled all the same; the count stays one too high for this delivery.
            logger.warning("Consumer %s: could not take back the delivery count of %d entries of %s/%s that did "
                           "not run: %s", self.consumer, len(messages), self.stream, self.group, exc)

    def _retry_delay(self, deliveries):
        return backoff_seconds(deliveries, self.retry_base, self.retry_cap)

    def _schedule_retry(self, entry_id, deliveries):
        due = self.clock() + self._retry_delay(deliveries)
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
        # Kept: what Redis refused, and what the group lost (then the recreation puts them back to be moved).
        kept = refused | (set(result.not_pending) if result.not_pending and self.lost_group.recreated_elsewhere() else set())
        self.to_dead_letter = [f for f in self.to_dead_letter if f[0] in kept]
        if refused:
            self.moves_due = self.clock() + REFUSED_RETRY_SECONDS
            refusals.refused("dead_letter", result.refused[0][1])
        elif oom is None:
            refusals.accepted()
