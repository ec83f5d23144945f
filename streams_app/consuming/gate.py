"""Ordered mode across a repartition: a partition of a new epoch reads nothing until its keys' past is done.

Per-key order across ``manage.py repartition`` (docs/cluster.md, "Repartitioning online"): a key's
messages published before the switch sit in a partition of the previous epoch, those after it in one
of the new epoch. The new partition's read loop holds its lease as usual but reads nothing until the
layout is sealed (no publisher writes to the previous partitions any more) and every previous
partition feeding its keys (streams_app.partitioning.layout.Layout.feeders: one when N is a multiple of the old
count) is drained for its group (streams_app.partitioning.drain). Then it opens for good.
"""
import logging

from streams_app.partitioning import drain, layout

logger = logging.getLogger("streams_app.consumer")

CHECK_SECONDS = 0.25  # how often a closed gate looks again (and how long its loop waits meanwhile)


class FeederGate:
    def __init__(self, spec, conn, shutdown, consumer=""):
        self.spec, self.conn, self.shutdown, self.consumer = spec, conn, shutdown, consumer
        self.open = spec.logical_stream is None  # a plain stream never waits
        self.waiting_since = None

    def closed(self, now):
        """True (after waiting a little) while this partition must not read; False from the opening on."""
        if self.open:
            return False
        live = layout.current(self.spec.logical)
        if live is None or not live.moving or self.spec.stream not in live.names:
            self._opened(live)
            return False
        if live.state == layout.SEALED and all(drain.drained(self.conn, feeder, self.spec.group)
                                                 for feeder in live.feeders(self.spec.stream)):
            self._opened(live)
            return False
        if self.waiting_since is None:
            self.waiting_since = now
            logger.info("Consumer %s: %s/%s (epoch %d) waits for %s to drain before it reads (per-key order)",
                        self.consumer, self.spec.stream, self.spec.group, live.epoch,
                        ", ".join(live.feeders(self.spec.stream)))
        self.shutdown.wait(CHECK_SECONDS)
        return True

    def _opened(self, live):
        self.open = True
        if self.waiting_since is not None:
            logger.info("Consumer %s: %s/%s reads now: the partitions feeding its keys are drained",
                        self.consumer, self.spec.stream, self.spec.group)
