"""The live partition layout of a stream, once ``manage.py repartition`` changed it (docs/cluster.md).

Until a stream is repartitioned its layout is the declared one (STREAMS["PARTITIONS"], epoch 0,
streams_app.partitioning.partitions). ``repartition`` records the live one in ``{S}:layout`` (a JSON object in the
logical stream's slot), and from then on that record wins over the setting:

- ``epoch``: 0 for the declared layout, +1 per repartition. Partitions of epoch >= 1 have names of
  their own (``S:e<epoch>.<i>``), so a partition of one epoch is never a partition of another.
- ``names``: where publishers send new messages (routing by CRC-32 of the key over these).
- ``state``: ``stable``; ``migrating`` (the new names are published, the previous ones still read);
  ``sealed`` (every publisher had the time to switch: an ordered partition of the new epoch may start
  once the previous partitions feeding its keys are drained for its group).
- ``previous``: the names of the epoch before, while migrating or sealed; ``retired``: the names of
  every earlier epoch, for their dead letters.

Every process reads the record at most once per REFRESH_SECONDS per stream (a cached GET), so each
follows a change within about a second without a restart; when Redis does not answer, the last
known layout (else the declared one) stands.
"""
import contextlib
import json
import math
import threading
import time

from django.core.signals import setting_changed

from streams_app.redis import keys

# How stale a process's view of a layout may be: repartition waits SWITCH_SECONDS (several of these)
# after publishing a new epoch before it treats the previous partitions as closed to new messages.
REFRESH_SECONDS = 1.0
SWITCH_SECONDS = 3 * REFRESH_SECONDS + 1.0

STABLE, MIGRATING, SEALED = "stable", "migrating", "sealed"


def layout_key(stream):
    return f"{keys.hash_tag(stream)}:layout"


class Layout:
    """One recorded layout (a read-only view of the JSON record)."""

    def __init__(self, stream, record):
        self.stream = stream
        self.record = record
        self.epoch = int(record["epoch"])
        self.names = list(record["names"])
        self.state = record.get("state", STABLE)
        self.previous = list(record.get("previous") or [])
        self.retired = list(record.get("retired") or [])

    @property
    def moving(self):
        return self.state in (MIGRATING, SEALED)

    def reading(self):
        """The partitions consumers read: the previous ones too while they drain."""
        return self.previous + self.names if self.moving else list(self.names)

    def every_name(self):
        """Every partition this stream ever had: where dead letters may be."""
        seen = []
        for name in self.retired + self.previous + self.names:
            if name not in seen:
                seen.append(name)
        return seen

    def feeders(self, name):
        """The previous partitions whose keys partition ``name`` of this epoch receives (gcd rule)."""
        if not self.moving or name not in self.names:
            return []
        old, new = len(self.previous), len(self.names)
        step = math.gcd(old, new)
        index = self.names.index(name)
        return [p for i, p in enumerate(self.previous) if i % step == index % step]

    def as_json(self):
        return json.dumps(self.record, sort_keys=True)


def parse(stream, raw):
    if not raw:
        return None
    try:
        return Layout(stream, json.loads(raw))
    except (ValueError, KeyError, TypeError):
        return None  # not a record Shoal wrote: the declared layout stands (repartition refuses it)


def read(conn, stream):
    """The recorded layout of ``stream`` from Redis now (None: never repartitioned)."""
    return parse(stream, conn.get(layout_key(stream)))


DOWN_SECONDS = 5.0
"""After a read of the layout failed (Redis down or hung), how long no read is tried for any stream: each
try may cost ADMIN_REDIS_TIMEOUT, and a page or a worker's start asks for the layouts of many streams."""
_cache = {}  # stream -> (monotonic time read, Layout or None)
_lock = threading.Lock()
_offline = threading.local()
_down_until = [0.0]  # monotonic time before which no read is tried (Redis failed the last one)


@contextlib.contextmanager
def offline():
    """Within: ``current()`` answers from the cache (else None) and opens no connection (a zygote
    before it forks its workers, streams_app/supervisor/zygote.py)."""
    _offline.on = True
    try:
        yield
    finally:
        _offline.on = False


def current(stream, conn=None, clock=time.monotonic):
    """The live layout of ``stream`` as this process knows it (at most REFRESH_SECONDS old); None when
    it was never repartitioned or Redis never answered."""
    now = clock()
    cached = _cache.get(stream)
    if cached is not None and (now - cached[0] < REFRESH_SECONDS or getattr(_offline, "on", False)):
        return cached[1]
    if getattr(_offline, "on", False):
        return None
    if now < _down_until[0]:  # Redis failed a moment ago: no new try (for any stream) until then
        return cached[1] if cached is not None else None
    # One refresh at a time. While it runs, a caller that knows a layout goes on with it instead of
    # waiting: a request, a health check or a publish must not queue behind a read of a hung Redis.
    if not _lock.acquire(blocking=cached is None):
        return cached[1]
    try:
        cached = _cache.get(stream)
        if cached is not None and now - cached[0] < REFRESH_SECONDS:
            return cached[1]
        try:
            if conn is None:
                # The admin's short timeout (ADMIN_REDIS_TIMEOUT), not the shared pool's: this read runs
                # inside web requests, health checks and publishes, which a frozen Redis must not hold.
                from streams_app.redis.connection import web_connection

                conn = web_connection()
            value = read(conn, stream)
        except Exception:  # noqa: BLE001 - Redis down or not configured: keep what we knew
            # Keep what we knew; try again after a pause, not on every publish nor once per stream.
            # From the failure's end, not the call's start: a read that timed out took longer than that.
            _down_until[0] = clock() + DOWN_SECONDS
            return cached[1] if cached is not None else None
        _cache[stream] = (now, value)
        return value
    finally:
        _lock.release()


def known():
    """The streams whose layout this process has read and found recorded."""
    return [stream for stream, (_, value) in list(_cache.items()) if value is not None]


def forget(**kwargs):
    """Drop the cached layouts (settings changed; tests flush Redis; repartition wrote a new one)."""
    _cache.clear()
    _down_until[0] = 0.0


setting_changed.connect(forget, weak=False)
