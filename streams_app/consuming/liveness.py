"""Consumer liveness: each consumer process renews a deadline per stream it reads.

``{stream}:consumers`` is a hash of consumer name -> deadline (ms on the Redis clock). A worker
renews it every CONSUMER_TTL / 3 and removes it on a clean exit. A name whose deadline has
passed belongs to a process that died (SIGKILL, OOM, lost host): its pending entries can be
taken over at once instead of after PENDING_TIMEOUT_MS. Consumers that never wrote a deadline
(older deployments, other clients) are not judged: for them the pending timeout still rules.
"""
from shoal_common.text import to_text
from streams_app.redis import scripts
from streams_app.redis.connection import per_slot
from streams_app.redis.keys import liveness_key


def reader_client_name(consumer):
    """CLIENT SETNAME of a consumer's blocking-read connections (streams_app.consuming.worker)."""
    return f"shoal-reader:{consumer}"


def _pipelines(conn, streams, pipeline):
    """``[(pipeline, liveness keys)]``: the caller's pipeline, or a plain one per node (a cluster
    pipeline refuses scripts)."""
    keys_ = [liveness_key(stream) for stream in streams]
    return [(pipeline, keys_)] if pipeline is not None else per_slot(conn, keys_)


def beat(conn, streams, consumer, ttl_ms, pipeline=None):
    for pipe, node_keys in _pipelines(conn, streams, pipeline):
        for key in node_keys:
            scripts.run(conn, "liveness_beat", [key], [consumer, int(ttl_ms), ""], pipeline=pipe)
        if pipeline is None:
            pipe.execute()


def forget(conn, streams, consumer, pipeline=None, names=()):
    """Drop the deadline of ``consumer`` (and of ``names``): a clean exit, or a consumer removed."""
    for pipe, node_keys in _pipelines(conn, streams, pipeline):
        for key in node_keys:
            for name in ([consumer] if consumer else []) + list(names):
                scripts.run(conn, "liveness_beat", [key], [name, 0, "forget"], pipeline=pipe)
        if pipeline is None:
            pipe.execute()


def dead_consumers(conn, stream):
    """Names on ``stream`` whose deadline has passed."""
    return {to_text(name, errors="backslashreplace")
            for name in scripts.run(conn, "liveness_dead", [liveness_key(stream)], [])}


def prune(conn, stream, grace_ms):
    """Forget names whose deadline lapsed more than ``grace_ms`` ago, known to a group or not.

    Names that still hold pending entries in a group of the stream keep their record: it is what
    lets a consumer take those entries over at once. The names go to Redis as the bytes it gave
    (another client may read a group under a name that is not UTF-8); the forgotten ones come back
    as text, invalid UTF-8 as ``\\xNN`` escapes, for the log.
    """
    holding = set()
    for group in conn.xinfo_groups(stream):
        if int(group["pending"]):
            holding.update(c["name"] for c in conn.xinfo_consumers(stream, group["name"]) if int(c["pending"]))
    return [to_text(name, errors="backslashreplace") for name in
            scripts.run(conn, "liveness_prune", [liveness_key(stream)], [int(grace_ms), *sorted(holding)])]
