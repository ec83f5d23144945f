"""Ordered mode's partition leases: which consumer of a group reads which partition.

Each partition ``S:i`` has a lease ``{S:i}:lease:<group>`` (streams_app.redis.keys.lease_key) in the
partition's own slot, so the read loop's scripts check it together with the stream (fencing, see
streams_app.consuming.ordered). Its value is a token naming the holder and the grant; its TTL runs
on the Redis clock (SET PX, PEXPIRE), renewed every LEASE_INTERVAL_MS by a Coordinator thread.

Balance: members heartbeat into ``{S}:members:<group>`` (deadlines on the Redis clock); each takes up
to ceil(N / live members) leases, in rendezvous-hash (HRW) order of preference, and sheds the ones
it likes least when over that share. HRW keeps assignments sticky: when a member joins or leaves,
only about 1/K of the partitions move. A member that stops renewing (SIGKILL, a pause) loses its
leases when they lapse on the Redis clock; others pick them up within LEASE_TTL_MS + one interval.

This process trusts a lease only until a local deadline that cannot be later than the Redis one: the
monotonic time *before* the renewing command was sent, plus the TTL, minus a margin for clock rate
differences. Past it the read loop starts no handler and reads nothing until a renewal succeeds.
"""
import itertools
import logging
import math
import threading
import time
import zlib

import redis

from shoal_common.text import to_text
from streams_app.redis import keys, scripts
from streams_app.redis.connection import TRANSIENT_ERRORS, recover
from streams_app.metrics import ordered as metrics

logger = logging.getLogger("streams_app.consumer")

FREE, TAKEN, OWNED, RELEASING = "free", "taken", "owned", "releasing"
# Clocks of two hosts may run at slightly different rates: trust a lease this much less than its TTL.
CLOCK_MARGIN = 0.02


def hrw(member, partition):
    """Rendezvous weight of ``member`` for ``partition``: stable across processes (never ``hash()``)."""
    return zlib.crc32(f"{member}|{partition}".encode())


class Lease:
    """One partition's lease as this process sees it.

    Written by the Coordinator (grant, renew, loss, shed request) and by the partition's read loop
    (takeover done, release, loss found by a fenced command); transitions take the lock.
    ``state``: FREE (not ours), TAKEN (granted; the loop has not yet taken the pending entries over),
    OWNED (the loop reads it), RELEASING (over our share: the loop finishes in-flight work, then releases).
    """

    def __init__(self, stream, group, consumer, ttl_ms, clock=time.monotonic):
        self.stream = stream
        self.key = keys.lease_key(stream, group)
        self.consumer = consumer
        self.ttl = ttl_ms / 1000
        self.clock = clock
        self.lock = threading.Lock()
        self.state = FREE
        self.token = None
        self.deadline = 0.0
        self.granted_event = threading.Event()  # wakes an idle read loop when the lease comes
        self.failed = None  # the exception that killed the Coordinator: the read loop re-raises it
        self._grants = itertools.count(1)

    def __repr__(self):
        return f"<Lease {self.key} {self.state} {self.token}>"

    @property
    def holding(self):
        return self.state != FREE

    def valid(self, now=None):
        """Whether this process may act as the owner now (by its conservative local deadline)."""
        now = self.clock() if now is None else now
        return self.state != FREE and now < self.deadline

    def next_token(self):
        # The grant number makes each grant's token unique: a command of an earlier grant of this
        # same process (paused past the TTL, then granted again) is refused like anyone else's.
        return f"{self.consumer}#{next(self._grants)}"

    def _trust_until(self, sent):
        return sent + self.ttl * (1 - CLOCK_MARGIN)

    def granted(self, token, sent):
        with self.lock:
            self.state, self.token, self.deadline = TAKEN, token, self._trust_until(sent)
        self.granted_event.set()

    def renewed(self, sent):
        with self.lock:
            if self.state != FREE:
                self.deadline = self._trust_until(sent)

    def taken_over(self, token):
        with self.lock:
            if self.state == TAKEN and self.token == token:
                self.state = OWNED

    def shed(self):
        with self.lock:
            if self.state in (TAKEN, OWNED):
                self.state = RELEASING

    def lost(self, token=None):
        """Not ours any more (``token``: only if still that grant)."""
        with self.lock:
            if token is None or self.token == token:
                self.state, self.token, self.deadline = FREE, None, 0.0
                self.granted_event.clear()

    def release(self, conn):
        """Give the lease back at once (a clean stop, or a shed): DEL only if it is still ours."""
        token = self.token
        if token is not None:
            try:
                scripts.run(conn, "lease", [self.key], [token, 0])
            except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:
                logger.info("Consumer %s: could not release the lease of %s (%s); it lapses by itself",
                            self.consumer, self.stream, exc)
        self.lost(token)


class Coordinator:
    """Heartbeat, renew, shed above the fair share, acquire up to it: one pass is ``tick()``."""

    def __init__(self, conn, logical_stream, group, consumer, leases, *, ttl_ms, interval_ms, clock=time.monotonic,
                 closing=None):
        self.conn = conn
        self.logical_stream = logical_stream
        self.group = group
        self.consumer = consumer
        self.leases = list(leases)
        self.ttl_ms = int(ttl_ms)
        self.interval = interval_ms / 1000
        self.clock = clock
        self.members_key = keys.members_key(logical_stream, group)
        self.stopping = threading.Event()
        # Set when the worker stops reading: leases are still renewed (in-flight handlers finish under
        # them) but no new one is taken, since no read loop would use it.
        self.closing = closing or threading.Event()
        self.thread = None
        self.failures = 0

    def start(self):
        self.thread = threading.Thread(target=self.run, name=f"shoal-leases-{self.logical_stream}", daemon=True)
        self.thread.start()

    def run(self):
        try:
            while not self.stopping.is_set():
                self.step()
                self.stopping.wait(self.interval)
        except Exception as exc:
            # Unknown: nothing renews these leases any more. The read loops re-raise it, so the worker
            # exits (EXIT_CRASH) and is replaced, rather than sitting idle with lapsed leases.
            logger.exception("Consumer %s: the lease coordinator of %s/%s crashed", self.consumer,
                             self.logical_stream, self.group)
            for lease in self.leases:
                lease.failed = exc
                lease.granted_event.set()

    def step(self):
        try:
            self.tick()
        except TRANSIENT_ERRORS as exc:
            self.failures += 1
            recover(self.conn)
            if self.failures == 1:
                logger.warning("Consumer %s: cannot renew the leases of %s/%s (%s); the partitions stop when "
                               "they lapse", self.consumer, self.logical_stream, self.group, exc)
        except redis.ResponseError as exc:  # maxmemory refuses SET: keep what we hold, take nothing new
            logger.warning("Consumer %s: Redis refused a lease command of %s/%s: %s", self.consumer,
                           self.logical_stream, self.group, exc)
        else:
            self.failures = 0

    def members(self, ttl_ms):
        live = scripts.run(self.conn, "lease_members", [self.members_key], [self.consumer, ttl_ms])
        return sorted(to_text(m) for m in live)

    def tick(self):
        live = self.members(self.ttl_ms)
        share = math.ceil(len(self.leases) / max(1, len(live)))
        for lease in self.leases:
            if lease.holding:
                self._renew(lease)
        preferred = sorted(self.leases, key=lambda lease: hrw(self.consumer, lease.stream), reverse=True)
        keep = [lease for lease in preferred if lease.state in (TAKEN, OWNED)][:share]
        for lease in preferred:
            if len(keep) >= share:
                break
            if lease.state == FREE and not self.closing.is_set() and self._acquire(lease):
                keep.append(lease)
        for lease in preferred:
            if lease.state in (TAKEN, OWNED) and lease not in keep:
                # Shed the least preferred first: they are another member's favourites. The read loop
                # finishes what it started and releases the lease itself.
                lease.shed()
        metrics.set_held(self.logical_stream, self.group, self.consumer, sum(lease.holding for lease in self.leases))

    def _renew(self, lease):
        token, sent = lease.token, self.clock()
        if token is None:
            return
        if scripts.run(self.conn, "lease", [lease.key], [token, self.ttl_ms]):
            lease.renewed(sent)
        else:
            logger.warning("Consumer %s: lost the lease of %s/%s (it lapsed: this process was paused or cut "
                           "off for longer than LEASE_TTL_MS); another consumer may own it now",
                           self.consumer, lease.stream, self.group)
            lease.lost(token)

    def _acquire(self, lease):
        token, sent = lease.next_token(), self.clock()
        if not scripts.run(self.conn, "lease", [lease.key], [token, self.ttl_ms]):
            return False
        lease.granted(token, sent)
        logger.info("Consumer %s: acquired the lease of %s/%s", self.consumer, lease.stream, self.group)
        return True

    def stop(self):
        self.stopping.set()

    def leave(self):
        """After the read loops ended: release what is still held and leave the members at once."""
        self.stop()
        if self.thread is not None:
            self.thread.join(timeout=5)
        for lease in self.leases:
            if lease.holding:
                lease.release(self.conn)
        try:
            scripts.run(self.conn, "lease_members", [self.members_key], [self.consumer, 0])
        except (*TRANSIENT_ERRORS, redis.ResponseError):
            pass  # its deadline lapses by itself
        metrics.forget(self.logical_stream, self.group, self.consumer)


class LeaseTable:
    """The leases of one worker's ordered consumers, and a Coordinator per (logical stream, group)."""

    def __init__(self, consumer, config, clock=time.monotonic):
        self.consumer = consumer
        self.ttl_ms = config["LEASE_TTL_MS"]
        self.interval_ms = config["LEASE_INTERVAL_MS"]
        self.clock = clock
        self.groups = {}  # (logical stream, group) -> [Lease] in partition order
        self.coordinators = []

    def lease_for(self, spec):
        lease = Lease(spec.stream, spec.group, self.consumer, self.ttl_ms, self.clock)
        self.groups.setdefault((spec.logical, spec.group), []).append(lease)
        return lease

    def start(self, conn, closing):
        for (logical_stream, group), leases in sorted(self.groups.items()):
            coordinator = Coordinator(conn, logical_stream, group, self.consumer, leases, ttl_ms=self.ttl_ms,
                                      interval_ms=self.interval_ms, clock=self.clock, closing=closing)
            coordinator.start()
            self.coordinators.append(coordinator)

    def leave(self):
        for coordinator in self.coordinators:
            coordinator.leave()
