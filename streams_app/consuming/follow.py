"""A consumer process follows its streams' live partition layout (``manage.py repartition``).

Which partitions a worker reads is fixed when its read loops start. ``respecify`` makes a worker's specs
from the live layout (streams_app.partitioning.layout) when it is made, whatever the specs it was handed (a
zygote's, made before a repartition); ``LayoutFollower`` looks at the layout about once a second and,
when the partitions to read changed (a repartition started, or finished), stops the worker cleanly
(in-flight entries finished and acknowledged, leases released) so that it starts again on the new
layout: a supervised worker is replaced by the supervisor at once, ``runconsumer`` without a supervisor
makes a new worker in the same process.

A consumer started on one partition of a stream (``runconsumer orders:0.1:email``) keeps that partition.
"""
import logging
from dataclasses import replace

from streams_app import registry
from streams_app.partitioning import layout, partitions

logger = logging.getLogger("streams_app.consumer")


def _followed(specs):
    """{(logical stream, group): [its specs]} of the consumers that read a whole (possibly partitioned) stream."""
    pairs = {}
    for spec in specs:
        if getattr(spec, "bands", None):
            continue
        pairs.setdefault((spec.logical, spec.group), []).append(spec)
    return {pair: group for pair, group in pairs.items()
            if len(group) > 1 or group[0].partition is None}


def respecify(specs):
    """``specs`` with each whole stream's partitions as the live layout has them (order kept)."""
    followed = _followed(specs)
    out, done = [], set()
    for spec in specs:
        pair = (spec.logical, spec.group)
        if pair not in followed:
            out.append(spec)
            continue
        if pair in done:
            continue
        done.add(pair)
        # Expanded from the spec given (its handler and options), only its partitions made anew.
        whole = replace(followed[pair][0], stream=pair[0], logical_stream=None, partition=None)
        out.extend(registry.expand(whole))
    return out


def wanted(specs):
    return {pair: sorted(partitions.reading(pair[0])) for pair in _followed(specs)}


class LayoutFollower:
    def __init__(self, specs, clock):
        self.clock = clock
        self.reading = {pair: sorted(spec.stream for spec in group) for pair, group in _followed(specs).items()}
        self.due = 0.0
        self.changed = None  # why the worker stopped to follow, once it did

    def tick(self):
        """The logical stream whose partitions to read changed, else None (at most one look per second)."""
        now = self.clock()
        if now < self.due or not self.reading:
            return None
        self.due = now + layout.REFRESH_SECONDS
        for pair, streams in self.reading.items():
            if sorted(partitions.reading(pair[0])) != streams:
                self.changed = pair[0]
                return pair[0]
        return None
