"""Stopping a GroupLoop, and its Redis trouble: draining, leaving the group, outages.

``drain`` lets in-flight handlers finish until the shutdown deadline, acking and keeping their entries
alive meanwhile, then ``leave``s the group if this consumer holds nothing, so a clean stop leaves no
consumer name behind. ``_redis_down`` and ``_redis_ok`` are what ``step`` calls around a pass: back off
on connection errors (and follow a failover), one warning per outage (outage.py).

A base class of loop.GroupLoop, split out by role. It owns the loop's ``failures`` count; it reads the
loop's ``shutdown`` (its deadline), clock, handler chunks, ``to_ack`` and ``to_dead_letter``, ``ready``
and the lost-group protocol (a group found recreated elsewhere while stopping is made ready, so the
dead-letter moves it puts back are made now), and calls the loop's collect, keep_alive, flush_acks,
flush_failures and make_ready.
"""
import logging
import time

import redis

from shoal_common.backoff import backoff_delay
from streams_app.redis import scripts
from streams_app.redis.connection import TRANSIENT_ERRORS, recover
from streams_app.redis.keys import running_key

logger = logging.getLogger("streams_app.consumer")


class Stopping:
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
            left = scripts.run(self.conn, "leave_group", [self.stream, running_key(self.stream, self.group, self.consumer)],
                               [self.group, self.consumer])
        except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:  # Redis down, or the group gone with it
            logger.info("Consumer %s: could not leave %s/%s (%s); the reclaim daemon removes it later",
                        self.consumer, self.stream, self.group, exc)
            return False
        return bool(left)

    def _try_flush(self):
        try:
            self.flush_acks()
            self.flush_failures()
            if not self.ready and self.lost_group.lost and self.to_dead_letter:  # found recreated elsewhere while stopping
                self.make_ready(self.clock())  # puts the moves back in the group, to be made now
                self.flush_failures()
            return True
        except TRANSIENT_ERRORS:
            return False

    def _redis_down(self, exc):
        self.failures += 1
        recover(self.conn)  # scripts and CLIENT LIST go to nodes directly: follow a failover
        if self.reader is not self.conn:
            # The reader is a cluster client of its own: XREADGROUP's keys are asked of its default node
            # (COMMAND GETKEYS), and redis-py keeps that node when it dies, so every read failed for as
            # long as the node REDIS_URL named stayed down. A fresh slot map names a live one.
            recover(self.reader)
        if self.failures == 1 and self.outage.went_down(self):
            logger.warning("Consumer %s: Redis unreachable (%s); retrying with back-off", self.consumer, exc)
        self.shutdown.wait(backoff_delay(self.failures, first=0.1, cap=self.backoff_max, jitter=0.5))

    def _redis_ok(self):
        if self.failures:
            if self.outage.came_back(self):
                logger.warning("Consumer %s: Redis reachable again after %d failed attempts", self.consumer,
                               self.failures)
            self.failures = 0
