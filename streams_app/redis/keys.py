"""Names of the Redis keys that belong to a stream.

They embed the stream name as a hash tag, ``{orders}:dlq``, so that on Redis Cluster every key of
one stream lives in the stream's slot and multi-key scripts keep working.
"""
from shoal_common.text import to_text


def hash_tag(stream):
    return "{" + stream + "}"


def key_type(conn, key):
    """What ``key`` holds on the server ("stream"; "none" when missing): a key of another type is
    reported to the user and left alone, never written over."""
    return to_text(conn.type(key))


def stream_key(stream):
    """The stream's own key. Plain name, so producers outside Shoal can XADD to it as they always did."""
    return stream


def dead_letter_key(stream):
    return f"{hash_tag(stream)}:dlq"


def scheduled_key(stream):
    """Deferred messages of ``stream`` (a sorted set): scheduled id -> when it is due, ms on the Redis
    clock (streams_app/publishing/scheduled.py)."""
    return f"{hash_tag(stream)}:scheduled"


def scheduled_data_key(stream):
    """The fields of the deferred messages of ``stream`` (a hash): scheduled id -> netstring list."""
    return f"{hash_tag(stream)}:scheduled:data"


def error_key(stream, group, entry_id):
    """The last error of a pending entry (a hash with a TTL): read when the entry is dead-lettered."""
    return f"{hash_tag(stream)}:error:{group}:{entry_id}"


def idempotency_key(stream, group, key):
    """The Redis idempotency guard of ``key`` in ``group``."""
    return f"{hash_tag(stream)}:idem:{group}:{key}"


def settling_key(stream, group):
    """Set while a group lost under its consumers settles (lua/recreate_group.lua): its value is the
    largest last-read id reported so far; reads meanwhile are taken back (lua/take_back_read.lua)."""
    return f"{hash_tag(stream)}:settling:{group}"


def groups_key(stream):
    """The names of every group ever created on ``stream`` (a set): a group missing from the stream but
    named here was lost (XGROUP DESTROY, DEL of the stream) and is being recreated, not new."""
    return f"{hash_tag(stream)}:groups"


def replay_job_key(stream, job_id):
    """What a background replay job (streams_app/deadletters/jobs.py) has replayed so far (a hash),
    counted by the replay script itself: exact across a runner that died and a takeover."""
    return f"{hash_tag(stream)}:replay-job:{job_id}"


def liveness_key(stream):
    """Consumer name -> liveness deadline (ms, Redis clock) of the consumers reading ``stream``."""
    return f"{hash_tag(stream)}:consumers"


def snapshot_lock_key(stream, group):
    """Held briefly by the reclaim daemon that writes the group's snapshot row this interval."""
    return f"{hash_tag(stream)}:snapshot:{group}"


def lease_key(stream, group):
    """Ordered mode: who owns ``stream`` (a partition) for ``group``; in the partition's slot, so a
    script can check it together with the stream (fencing)."""
    return f"{hash_tag(stream)}:lease:{group}"


def members_key(logical_stream, group):
    """Ordered mode: member -> deadline (ms, Redis clock) of the consumers of ``group`` sharing the
    leases of ``logical_stream``'s partitions."""
    return f"{hash_tag(logical_stream)}:members:{group}"


def running_key(stream, group, consumer):
    """What ``consumer`` of ``group`` is running right now (a hash, one field per chunk, with a TTL):
    read by whoever takes its entries over, to charge a run only to those (consuming/runs.py). A name
    that is not UTF-8 (another client's, given as the bytes Redis holds) makes a key of those bytes."""
    if isinstance(consumer, bytes):
        return f"{hash_tag(stream)}:running:{group}:".encode() + consumer
    return f"{hash_tag(stream)}:running:{group}:{consumer}"
