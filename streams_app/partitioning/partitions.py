"""Partitioned streams: ``STREAMS["PARTITIONS"] = {"orders": 6}`` spreads one logical stream over N streams.

Each partition is an ordinary Shoal stream with a plain name of its own (``orders:0`` ...), so its
dead letters, errors, idempotency and liveness keys (``{orders:0}:...``) live in its own cluster
slot and every Lua script stays single-slot. Names are derived, never scanned: partition *i* is
``S:i`` when that name's slot falls in the *i*-th N-th of the slot space, else the first ``S:i.k``
that does, which spreads the partitions evenly over the masters of a standard cluster layout.

The list of names is recorded in Redis (``{S}:partitions``, written once with SET NX): changing N
in the settings for a stream that has entries would move keys to other partitions (and break per-key
order), so it is refused with an error that says how to migrate. ``manage.py repartition`` changes the
count online instead (streams_app.operations.repartition): from then on the live layout recorded in Redis
(streams_app.partitioning.layout, epochs) wins over the setting, and ``names()`` returns it.
"""
import itertools
import json
import threading
import zlib

from django.core.signals import setting_changed
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from streams_app.redis import keys
from streams_app.partitioning import layout
from streams_app.conf import setting
from streams_app.exceptions import PartitionConfigError


def count(stream):
    """Partitions of ``stream`` as declared in STREAMS["PARTITIONS"] (1: not partitioned)."""
    declared = setting("PARTITIONS") or {}
    return int(declared.get(stream, 1)) if isinstance(declared, dict) else 1


def is_partitioned(stream):
    return names(stream) != [stream]


def _slot(name):
    return key_slot(name.encode())


def partition_name(stream, index, n, epoch=0):
    """The stream key of partition ``index`` of ``n``: stable, so every process derives the same.

    Epoch 0 is the declared layout (``S:i``); a repartitioned one's names carry their epoch (``S:e2.i``)."""
    low, high = index * REDIS_CLUSTER_HASH_SLOTS // n, (index + 1) * REDIS_CLUSTER_HASH_SLOTS // n
    plain = f"{stream}:{index}" if not epoch else f"{stream}:e{epoch}.{index}"
    if low <= _slot(plain) < high:
        return plain
    for salt in range(1, 100_000):
        name = f"{plain}.{salt}" if epoch else f"{stream}:{index}.{salt}"
        if low <= _slot(name) < high:
            return name
    return plain  # unreachable in practice: a few hundred tries find every range


_names_cache = {}


def names(stream, n=None, epoch=0):
    """The partition stream keys of ``stream``, in partition order (``[stream]`` when not partitioned).

    Without ``n``: the live layout, where new messages go (streams_app.partitioning.layout: recorded in Redis once
    ``repartition`` ran, re-read at most every second), else the declared one.
    """
    if n is None:
        live = layout.current(stream)
        if live is not None:
            return live.names
        n = count(stream)
    if n <= 1 and not epoch:
        return [stream]
    cached = _names_cache.get((stream, n, epoch))
    if cached is None:
        cached = _names_cache[(stream, n, epoch)] = [partition_name(stream, i, n, epoch) for i in range(n)]
    return cached


def reading(stream):
    """The partitions consumers of ``stream`` read: ``names()``, and while a repartition drains them, the
    previous epoch's partitions first."""
    live = layout.current(stream)
    return live.reading() if live is not None else names(stream)


def every_name(stream):
    """Every partition ``stream`` has had (retired epochs included): where its dead letters may be."""
    live = layout.current(stream)
    return live.every_name() if live is not None else names(stream)


def logical(name):
    """(logical stream, partition index or None) of a stream key, from the declared or live partitions.

    The index is within the partition's own epoch (a retired partition keeps its old index)."""
    declared = setting("PARTITIONS") or {}
    streams = list(declared) if isinstance(declared, dict) else []
    for stream in streams + [s for s in layout.known() if s not in streams]:
        if not name.startswith(f"{stream}:"):
            continue
        live = layout.current(stream)
        epochs = [live.names, live.previous, live.retired] if live is not None else [names(stream)]
        for group in epochs:
            if name in group:
                return stream, group.index(name)
    return name, None


def index_for_key(key, n):
    """The partition of a message key: CRC-32 of its UTF-8 bytes, modulo N.

    Stable across processes, restarts and languages (Python's ``hash()`` is salted per process).
    """
    return zlib.crc32(key.encode("utf-8")) % n


_round_robin = {}
_round_robin_lock = threading.Lock()


def next_index(stream, n):
    """Round-robin partition for messages without a key (per process)."""
    with _round_robin_lock:
        counter = _round_robin.get(stream)
        if counter is None:
            counter = _round_robin[stream] = itertools.count()
        return next(counter) % n


def route(stream, key=None):
    """The stream key a message of ``stream`` with ``key`` goes to."""
    partitions = names(stream)
    if len(partitions) == 1:
        return partitions[0]
    index = index_for_key(key, len(partitions)) if key is not None else next_index(stream, len(partitions))
    return partitions[index]


def record_key(stream):
    return f"{keys.hash_tag(stream)}:partitions"


# stream -> its partition names, once checked. The names follow from the settings alone, and a
# settings change empties this (forget_checks): one lookup per publish, not a layout rebuilt.
_checked = {}


def ensure_recorded(conn, stream):
    """Record ``stream``'s partition names in Redis, or check them against the recorded ones; return them.

    Once per process and stream. Raises PartitionConfigError when the declared layout differs
    from the recorded one (no record: the plain, unpartitioned stream) and the streams of the
    recorded layout that the new one drops still hold entries.
    """
    live = layout.current(stream, conn)
    if live is not None:
        return live.names  # repartitioned: the live layout wins over the setting (check streams_app.W031)
    checked = _checked.get(stream)
    if checked is not None:
        return checked
    wanted = names(stream)
    raw = conn.get(record_key(stream))
    recorded = json.loads(raw) if raw else [stream]
    if recorded != wanted:
        # Deferred messages waiting in a dropped stream's scheduled set would never be moved: they count too.
        sizes = {name: conn.xlen(name) + conn.zcard(keys.scheduled_key(name)) for name in recorded if name not in wanted}
        held = {name: size for name, size in sizes.items() if size}
        if held:
            raise PartitionConfigError(_refusal(stream, recorded, wanted, held))
        if len(wanted) > 1:
            conn.set(record_key(stream), json.dumps(wanted))
        else:
            conn.delete(record_key(stream))
    _checked[stream] = wanted
    return wanted


def _refusal(stream, recorded, wanted, held):
    where = f"{', '.join(map(repr, sorted(held)))} still hold {sum(held.values())} entries or deferred messages"
    if len(wanted) == 1:
        return (f"stream {stream!r} has {len(recorded)} partition(s) recorded in Redis ({record_key(stream)}) "
                f"and STREAMS['PARTITIONS'] no longer declares it; {where}. As a plain stream, {stream!r} would "
                f"get messages no consumer of the partitions reads (and its consumers would not read the "
                f"partitions), so it is refused. Put {{{stream!r}: {len(recorded)}}} back in STREAMS['PARTITIONS']; to stop "
                f"partitioning, declare a new stream name, publish there, let the old partitions drain, then "
                f"remove them (docs/cluster.md, \"Removing the old stream\").")
    return (f"stream {stream!r} has {len(recorded)} partition(s) in Redis and STREAMS['PARTITIONS'] "
            f"now declares {len(wanted)}; {where}. Changing the count would move keys to other partitions "
            f"(and break per-key order), so it is refused. To migrate, declare a new stream name with the "
            f"new count, publish there, and let the old stream's consumers drain it before you remove it "
            f"(docs/cluster.md, \"Removing the old stream\"); or put the old count back in "
            f"STREAMS['PARTITIONS'].")


def forget_checks(**kwargs):
    """Drop the per-process cache of checked layouts (settings changed; tests flush Redis)."""
    _checked.clear()


setting_changed.connect(forget_checks, weak=False)
